/* test-forward.c — the CPU forward against transformers' reference outputs
 * (reference.safetensors of each tests/data/tiny-* dir, see tests/data/README.md):
 * - last-position logits of every prompt within 1e-4 (max abs diff / max abs);
 * - the greedy continuation, up to the first step whose reference margin is < 1e-3;
 * - the top-1 id at every position of the short prompts, where the reference is decisive;
 * - the same prompt fed in chunks (prefill, then chunks of 1..13 tokens) gives the same logits;
 * - all prompts in one batch, and their greedy continuations decoded together as one batch
 *   per step, give each sequence's own results;
 * - batch invariance: every position's logits of several prompts are BITWISE equal whether a
 *   prompt runs alone or batched with the others (several groupings and chunkings), on 1 or
 *   3 threads.
 * Block tables hand out blocks in a scrambled order, so paging is exercised.
 * And the biases of o_proj and the MLP (Llama's attention_bias and mlp_bias, Qwen3's
 * attention_bias) on checkpoints written here: logits equal to a float64 forward written out
 * below from the formulas, with the biases and with them zeroed (which must differ), through
 * the MLP whole and in chunks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/model.h"
#include "atlas/tokenizer.h"
#include "ckpt.h"
#include "greedy.h"
#include "harness.h"
#include "model/forward.h"
#include "model/model_internal.h"
#include "format/safetensors.h"

enum { MAX_SEQS = 8, MAX_BLOCKS = 40, BLOCK = 16, N_GREEDY = 24 }; /* 40 * 16 > 543 + 24 */

typedef struct prompt {
    const int32_t *ids;
    int n;
    const float *last_logits;   /* [vocab] */
    const int32_t *topk_ids;    /* [n, 8] */
    const float *topk_values;   /* [n, 8] */
    const int32_t *greedy_ids;  /* [24] */
    const float *greedy_margins;
} prompt;

/* One sequence of the test's own little engine: its blocks and how much is cached. */
typedef struct seq {
    int32_t table[MAX_BLOCKS];
    int ctx;
} seq;

static int next_block;
static int n_kv_blocks;

/* Blocks are given out as (i * 37) mod n (n = MAX_SEQS * MAX_BLOCKS = 320, coprime to 37,
 * so all distinct): neighbours in a sequence are far apart. */
static void seq_init(seq *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < MAX_BLOCKS; i++) s->table[i] = (int32_t)((next_block++ * 37) % n_kv_blocks);
}

static const void *tensor(const atlas_st *st, const char *name) {
    const atlas_tensor_view *v = atlas_st_find(st, name);
    CHECK_MSG(v != NULL, "reference tensor %s missing", name);
    return v ? v->data : NULL;
}

/* Feeds chunk[s] = ids of seqs[s] (count[s] tokens, following what is cached) as one batch.
 * want_all: logits of every token (into logits, token-major), else of each seq's last. */
static atlas_status feed(atlas_model *m, seq **seqs, int n_seqs, const int32_t *const *chunk,
                         const int *count, int want_all, float *logits);

/* As feed, but only the argmax id of each sequence's last token (the backend's argmax). */
static atlas_status feed_argmax(atlas_model *m, seq **seqs, int n_seqs,
                                const int32_t *const *chunk, const int *count, int32_t *ids);

static atlas_status feed_impl(atlas_model *m, seq **seqs, int n_seqs, const int32_t *const *chunk,
                              const int *count, int want_all, float *logits, int32_t *ids) {
    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += count[s];
    int32_t *tokens = malloc(sizeof(int32_t) * total), *pos = malloc(sizeof(int32_t) * total);
    int32_t *rows = malloc(sizeof(int32_t) * total);
    int32_t start[MAX_SEQS + 1], ctx[MAX_SEQS], table[MAX_SEQS * MAX_BLOCKS];
    int t = 0, n_logits = 0;
    for (int s = 0; s < n_seqs; s++) {
        start[s] = t;
        for (int i = 0; i < count[s]; i++, t++) {
            tokens[t] = chunk[s][i];
            pos[t] = seqs[s]->ctx + i;
            if (want_all || i == count[s] - 1) rows[n_logits++] = t;
        }
        ctx[s] = seqs[s]->ctx + count[s];
        memcpy(table + s * MAX_BLOCKS, seqs[s]->table, sizeof seqs[s]->table);
    }
    start[n_seqs] = t;
    atlas_batch b = {.n_tokens = total, .tokens = tokens, .positions = pos, .n_seqs = n_seqs,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table,
                     .max_blocks = MAX_BLOCKS, .n_logits = n_logits, .logit_rows = rows};
    atlas_status st = ids ? atlas_model_forward_argmax(m, &b, ids) : atlas_model_forward(m, &b, logits);
    if (st == ATLAS_OK)
        for (int s = 0; s < n_seqs; s++) seqs[s]->ctx = ctx[s];
    free(tokens);
    free(pos);
    free(rows);
    return st;
}

static atlas_status feed(atlas_model *m, seq **seqs, int n_seqs, const int32_t *const *chunk,
                         const int *count, int want_all, float *logits) {
    return feed_impl(m, seqs, n_seqs, chunk, count, want_all, logits, NULL);
}

static atlas_status feed_argmax(atlas_model *m, seq **seqs, int n_seqs,
                                const int32_t *const *chunk, const int *count, int32_t *ids) {
    return feed_impl(m, seqs, n_seqs, chunk, count, 0, NULL, ids);
}

/* Greedy ids match the reference up to the first step with margin < 1e-3. */
static void check_greedy(const char *model, int p, const prompt *pr, const int32_t *got) {
    for (int i = 0; i < N_GREEDY; i++) {
        if (pr->greedy_margins[i] < 1e-3f) break;
        CHECK_MSG(got[i] == pr->greedy_ids[i], "%s p%d greedy step %d: got %d, want %d", model,
                  p, i, got[i], pr->greedy_ids[i]);
        if (got[i] != pr->greedy_ids[i]) break;
    }
}

/* One prompt alone: full prefill with every position's logits (short prompts) or only the
 * last, then greedy decoding token by token with the backend's argmax. */
static void test_single(atlas_model *m, const char *model, int p, const prompt *pr, int V,
                        int greedy) {
    seq s;
    seq_init(&s);
    seq *sp = &s;
    int all = pr->n <= 64;
    float *logits = malloc(sizeof(float) * V * (all ? pr->n : 1));
    CHECK_OK(feed(m, &sp, 1, &pr->ids, &pr->n, all, logits));
    const float *last = logits + (size_t)(all ? pr->n - 1 : 0) * V;
    double err = harness_rel_err(last, pr->last_logits, V);
    CHECK_MSG(err <= 1e-4, "%s p%d: last logits error %.3g > 1e-4", model, p, err);
    printf("%s p%d (%d tokens): last-logits error %.2e\n", model, p, pr->n, err);
    for (int i = 0; all && i < pr->n; i++) {
        const float *tv = pr->topk_values + i * 8;
        if (tv[0] - tv[1] < 1e-3f) continue;
        int got = harness_argmax(logits + (size_t)i * V, V);
        CHECK_MSG(got == pr->topk_ids[i * 8], "%s p%d position %d: top-1 %d, want %d", model, p,
                  i, got, pr->topk_ids[i * 8]);
    }
    int32_t gen[N_GREEDY], next = harness_argmax(last, V);
    for (int i = 0; greedy && i < N_GREEDY; i++) {
        gen[i] = next;
        int one = 1;
        const int32_t *tok = &gen[i];
        CHECK_OK(feed_argmax(m, &sp, 1, &tok, &one, &next)); /* the backend's argmax */
    }
    if (greedy) check_greedy(model, p, pr, gen);
    free(logits);
}

/* The prompt in chunks: the first half, then chunks of 1, 2, ..., 13, 1, 2, ... tokens (so
 * both single-token steps and multi-token chunks run over an existing cache); the last
 * logits must match the reference as the one-shot prefill does. */
static void test_chunked(atlas_model *m, const char *model, int p, const prompt *pr, int V) {
    seq s;
    seq_init(&s);
    seq *sp = &s;
    float *logits = malloc(sizeof(float) * V);
    int first = pr->n / 2 > 0 ? pr->n / 2 : 1;
    CHECK_OK(feed(m, &sp, 1, &pr->ids, &first, 0, logits));
    for (int i = first, k = 0; i < pr->n; k++) {
        int cnt = 1 + k % 13 < pr->n - i ? 1 + k % 13 : pr->n - i;
        const int32_t *chunk = pr->ids + i;
        CHECK_OK(feed(m, &sp, 1, &chunk, &cnt, 0, logits));
        i += cnt;
    }
    double err = harness_rel_err(logits, pr->last_logits, V);
    CHECK_MSG(err <= 1e-4, "%s p%d chunked: last logits error %.3g > 1e-4", model, p, err);
    free(logits);
}

/* All prompts as one batch, then their greedy continuations as one batch per step. */
static void test_batch(atlas_model *m, const char *model, const prompt *pr, int n, int V) {
    seq s[MAX_SEQS], *sp[MAX_SEQS];
    const int32_t *chunk[MAX_SEQS] = {0};
    int count[MAX_SEQS] = {0};
    int32_t gen[MAX_SEQS][N_GREEDY];
    float *logits = malloc(sizeof(float) * V * n);
    for (int i = 0; i < n; i++) {
        seq_init(&s[i]);
        sp[i] = &s[i];
        chunk[i] = pr[i].ids;
        count[i] = pr[i].n;
    }
    CHECK_OK(feed(m, sp, n, chunk, count, 0, logits));
    for (int i = 0; i < n; i++) {
        double err = harness_rel_err(logits + (size_t)i * V, pr[i].last_logits, V);
        CHECK_MSG(err <= 1e-4, "%s batch seq %d: last logits error %.3g > 1e-4", model, i, err);
    }
    for (int step = 0; step < N_GREEDY; step++) {
        for (int i = 0; i < n; i++) {
            gen[i][step] = harness_argmax(logits + (size_t)i * V, V);
            chunk[i] = &gen[i][step];
            count[i] = 1;
        }
        CHECK_OK(feed(m, sp, n, chunk, count, 0, logits));
    }
    for (int i = 0; i < n; i++) check_greedy(model, i, &pr[i], gen[i]);
    free(logits);
}

/* Feeds prompts ps[0..n) by a schedule and stores every position's logits of prompt i in
 * out[i] ([ps[i]->n, V]). Round r batches the unfinished prompts in the order rotated by
 * r * rotate, prompt i taking sizes[(r + i) % n_sizes] tokens (0: it sits this round out).
 * Blocks are handed out from block0 on, so each schedule pages into other blocks. */
static void feed_schedule(atlas_model *m, const prompt *const *ps, int n, int V,
                          const int *sizes, int n_sizes, int rotate, int block0, float **out) {
    seq s[MAX_SEQS], *sp[MAX_SEQS];
    int done[MAX_SEQS] = {0}, left = n, total_max = 0;
    next_block = block0;
    for (int i = 0; i < n; i++) {
        seq_init(&s[i]);
        total_max += ps[i]->n;
    }
    float *logits = malloc(sizeof(float) * V * total_max);
    for (int r = 0; left > 0 && logits; r++) {
        const int32_t *chunk[MAX_SEQS];
        int count[MAX_SEQS], idx[MAX_SEQS], nb = 0;
        for (int j = 0; j < n; j++) {
            int i = (j + r * rotate) % n, c = sizes[(r + i) % n_sizes];
            if (done[i] == ps[i]->n || c == 0) continue;
            if (c > ps[i]->n - done[i]) c = ps[i]->n - done[i];
            sp[nb] = &s[i];
            chunk[nb] = ps[i]->ids + done[i];
            count[nb] = c;
            idx[nb++] = i;
        }
        if (nb == 0) continue;
        atlas_status st = feed(m, sp, nb, chunk, count, 1, logits);
        CHECK_OK(st);
        if (st != ATLAS_OK) break;
        const float *row = logits;
        for (int b = 0; b < nb; b++) {
            int i = idx[b];
            memcpy(out[i] + (size_t)done[i] * V, row, sizeof(float) * V * count[b]);
            row += (size_t)V * count[b];
            done[i] += count[b];
            left -= done[i] == ps[i]->n;
        }
    }
    free(logits);
}

/* Batch invariance (issue 6: temperature-0 and seeded outputs must not depend on the batch):
 * the logits of every position of up to 4 short prompts, compared with memcmp against the
 * prompt run alone in one prefill on 1 thread. */
static void test_invariance(const char *dir, const char *model, const prompt *pr, int n_pr,
                            atlas_model *m1, atlas_cpu_activations act) {
    atlas_model_params params = atlas_model_default_params();
    params.device = ATLAS_DEVICE_CPU;
    params.cpu_activations = act;
    params.n_threads = 3;
    params.max_batch_tokens = 1024;
    params.load_tokenizer = 0;
    params.kv_block_size = BLOCK;
    params.kv_tokens = MAX_SEQS * MAX_BLOCKS * BLOCK;
    atlas_model *m3 = NULL, *m5 = NULL;
    CHECK_OK(atlas_model_load(dir, &params, &m3));
    params.mlp_chunk_tokens = 5; /* the MLP over 5 rows at a time: a batch makes many chunks */
    CHECK_OK(atlas_model_load(dir, &params, &m5));
    if (!m3 || !m5) return;
    int V = atlas_model_vocab_size(m1);
    const prompt *ps[4];
    int n = 0;
    for (int p = 0; p < n_pr && n < 4; p++)
        if (pr[p].n <= 64) ps[n++] = &pr[p];
    CHECK(n >= 3);
    float *ref[4], *got[4];
    for (int i = 0; i < n; i++) {
        ref[i] = malloc(sizeof(float) * V * ps[i]->n);
        got[i] = malloc(sizeof(float) * V * ps[i]->n);
    }
    static const int one_shot[] = {1 << 20}, chunks_a[] = {1, 3, 0, 7, 2, 16},
                     chunks_b[] = {5, 1, 0, 2, 1};
    for (int i = 0; i < n; i++) feed_schedule(m1, &ps[i], 1, V, one_shot, 1, 0, 0, &ref[i]);
    struct {
        const char *what;
        atlas_model *m;
        int alone;
        const int *sizes;
        int n_sizes, rotate, block0;
    } v[] = {
        {"alone, 3 threads", m3, 1, one_shot, 1, 0, 3},
        {"one batch, 1 thread", m1, 0, one_shot, 1, 0, 11},
        {"one batch, 3 threads", m3, 0, one_shot, 1, 1, 17},
        {"mixed chunks a, 3 threads", m3, 0, chunks_a, 6, 1, 29},
        {"mixed chunks b, 1 thread", m1, 0, chunks_b, 5, 3, 41},
        {"mixed chunks b, 3 threads", m3, 0, chunks_b, 5, 2, 53},
        {"one batch, MLP 5 rows at a time", m5, 0, one_shot, 1, 0, 67},
        {"mixed chunks a, MLP 5 rows at a time", m5, 0, chunks_a, 6, 2, 79},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        for (int i = 0; i < n; i++) memset(got[i], 0xff, sizeof(float) * V * ps[i]->n);
        if (v[k].alone)
            for (int i = 0; i < n; i++)
                feed_schedule(v[k].m, &ps[i], 1, V, v[k].sizes, v[k].n_sizes, 0, v[k].block0,
                              &got[i]);
        else
            feed_schedule(v[k].m, ps, n, V, v[k].sizes, v[k].n_sizes, v[k].rotate, v[k].block0,
                          got);
        for (int i = 0; i < n; i++) {
            int bad = -1;
            for (int t = 0; t < ps[i]->n && bad < 0; t++)
                if (memcmp(got[i] + (size_t)t * V, ref[i] + (size_t)t * V, sizeof(float) * V))
                    bad = t;
            CHECK_MSG(bad < 0, "%s: %s: prompt %d position %d: logits differ from alone",
                      model, v[k].what, i, bad);
        }
    }
    printf("%s: logits of %d prompts bitwise equal in %zu groupings (%s)\n", model, n,
           sizeof v / sizeof v[0] + 1,
           act == ATLAS_CPU_ACT_FP32 ? "fp32 activations" : "bf16 activations, bf16 KV");
    for (int i = 0; i < n; i++) {
        free(ref[i]);
        free(got[i]);
    }
    CHECK_OK(atlas_model_release(m3));
    CHECK_OK(atlas_model_release(m5));
}

/* End to end through the CLI: `atlas run --json` gives the reference's greedy ids, and the
 * streamed text of `atlas run -p` is the tokenizer's decoding of them. */
static void test_cli(const char *name, const prompt *pr, const char *prompt_text) {
    const char *bin = getenv("ATLAS_BIN");
    CHECK_MSG(bin != NULL, "ATLAS_BIN is not set");
    if (!bin) return;
    char dir[512], cmd[2048], ids[512] = "";
    snprintf(dir, sizeof dir, "%s/%s", harness_data_dir(), name);
    for (int i = 0; i < pr->n; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", pr->ids[i]);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --device cpu --threads 2 --prompt-ids %s -n %d "
             "--temp 0 --json --top-logprobs 3", bin, dir, ids, N_GREEDY);
    static char out[1 << 16]; /* 24 json lines of a few hundred bytes */
    int n = 0, rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
    int32_t got[N_GREEDY];
    for (int i = 0; i < N_GREEDY; i++) got[i] = -1;
    for (char *line = strtok(out, "\n"); line && n < N_GREEDY; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK_MSG(o && json_is_integer(json_object_get(o, "id")), "bad line: %s", line);
        got[n] = o ? (int32_t)json_integer_value(json_object_get(o, "id")) : -1;
        json_t *top = o ? json_object_get(o, "top_logprobs") : NULL;
        CHECK(json_array_size(top) == 3 && json_is_array(json_object_get(o, "bytes")));
        /* greedy: the chosen id is the most likely one, and its logprob is the top one */
        CHECK(json_integer_value(json_object_get(json_array_get(top, 0), "id")) == got[n]);
        CHECK(json_real_value(json_object_get(o, "logprob")) ==
              json_real_value(json_object_get(json_array_get(top, 0), "logprob")));
        json_decref(o);
        n++;
    }
    CHECK_MSG(n == N_GREEDY, "%s: %d json lines", name, n);
    check_greedy(name, 0, pr, got);

    if (!harness_require_file(harness_data_path(strcat(strcpy((char[64]){0}, name), "/tokenizer.json"))))
        return;
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --device cpu -p '%s' -n %d --temp 0 2>/dev/null",
             bin, dir, prompt_text, N_GREEDY);
    rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load(dir, &tok));
    char *want = NULL;
    size_t len = 0;
    int upto = 0; /* the ids that are sure to match: up to the first small margin */
    while (upto < N_GREEDY && pr->greedy_margins[upto] >= 1e-3f) upto++;
    if (tok) CHECK_OK(atlas_tokenizer_decode(tok, pr->greedy_ids, upto, false, &want, &len));
    CHECK_MSG(want && !strncmp(out, want, len), "%s: text '%s', want it to begin '%s'", name, out,
              want ? want : "");
    /* the generation's ends: -n 0, 1, 2, 3 print exactly
     * the text of the reference's first 0, 1, 2, 3 ids (-n 0: nothing at all) */
    for (int n_new = 0; n_new <= 3 && n_new <= upto && tok; n_new++) {
        static char part[1 << 12];
        char *want_n = NULL;
        size_t want_len = 0;
        CHECK_OK(atlas_tokenizer_decode(tok, pr->greedy_ids, n_new, false, &want_n, &want_len));
        snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --device cpu -p '%s' -n %d --temp 0 "
                 "2>/dev/null", bin, dir, prompt_text, n_new);
        rc = harness_run(cmd, part, sizeof part);
        CHECK_MSG(rc == 0, "%s: exit %d", cmd, rc);
        /* and, after a generation, the newline that ends the output */
        size_t nl = n_new > 0;
        CHECK_MSG(want_n && strlen(part) == want_len + nl && !memcmp(part, want_n, want_len) &&
                      (!nl || part[want_len] == '\n'),
                  "%s: -n %d printed '%s', want '%s'%s", name, n_new, part, want_n ? want_n : "",
                  nl ? " and a newline" : "");
        free(want_n);
    }
    free(want);
    atlas_tokenizer_free(tok);
}

/* Greedy steps queued a step ahead (atlas_model_forward_argmax_queue; the CPU computes each
 * at once and keeps its ids): the same ids as token-by-token argmax over a long run, the
 * reference's where its margins are clear; and the misuses, each a clear error. */
static void test_queued(atlas_model *m, const char *model, const prompt *pr) {
    enum { STEPS = 200 };
    int32_t want[STEPS], got[STEPS];
    seq s;
    next_block = 0;
    seq_init(&s);
    CHECK_OK(greedy_run(m, pr->ids, pr->n, s.table, BLOCK, STEPS, 0, want));
    CHECK_OK(greedy_run(m, pr->ids, pr->n, s.table, BLOCK, STEPS, 1, got));
    int same = 0;
    while (same < STEPS && got[same] == want[same]) same++;
    CHECK_MSG(same == STEPS, "%s: queued greedy id %d of %d differs (%d, want %d)", model, same,
              STEPS, same < STEPS ? got[same] : 0, same < STEPS ? want[same] : 0);
    check_greedy(model, 0, pr, got);

    int32_t tok = want[0], id = -1, pos = 0, start[2] = {0, 1}, ctx = 1, row = 0;
    const int32_t prev = ATLAS_BATCH_PREV(0), past = ATLAS_BATCH_PREV(1);
    atlas_batch b = {.n_tokens = 1, .tokens = &prev, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = s.table,
                     .max_blocks = 1, .n_logits = 1, .logit_rows = &row};
    CHECK(atlas_model_argmax_collect(m, &id, 1) == ATLAS_ERR_INVALID); /* nothing queued */
    CHECK(atlas_model_forward_argmax_queue(m, &b) == ATLAS_ERR_RANGE); /* no step before */
    CHECK(atlas_model_forward_argmax(m, &b, &id) == ATLAS_ERR_RANGE);  /* not a queued step */
    b.tokens = &tok;
    CHECK_OK(atlas_model_forward_argmax_queue(m, &b));
    pos = 1, ctx = 2;
    b.tokens = &past; /* the step before has one row */
    CHECK(atlas_model_forward_argmax_queue(m, &b) == ATLAS_ERR_RANGE);
    b.tokens = &prev;
    CHECK_OK(atlas_model_forward_argmax_queue(m, &b));
    CHECK(atlas_model_forward_argmax_queue(m, &b) == ATLAS_ERR_BUSY); /* 2 queued */
    CHECK(atlas_model_forward_argmax(m, &b, &id) == ATLAS_ERR_BUSY);
    CHECK(atlas_model_argmax_collect(m, &id, 2) == ATLAS_ERR_RANGE); /* the step has 1 row */
    int32_t q[2] = {-1, -1}, e[2] = {-2, -2};
    CHECK_OK(atlas_model_argmax_collect(m, &q[0], 1));
    CHECK_OK(atlas_model_argmax_collect(m, &q[1], 1));
    b.tokens = &tok; /* nothing queued: usable again, and the same two steps agree */
    pos = 0, ctx = 1;
    CHECK_OK(atlas_model_forward_argmax(m, &b, &e[0]));
    b.tokens = &e[0];
    pos = 1, ctx = 2;
    CHECK_OK(atlas_model_forward_argmax(m, &b, &e[1]));
    CHECK_MSG(q[0] == e[0] && q[1] == e[1], "%s: queued %d %d, token by token %d %d", model,
              q[0], q[1], e[0], e[1]);
    printf("%s: %d queued greedy steps equal token-by-token argmax\n", model, same);
}

/* Sampled steps queued a step ahead (atlas_model_forward_sample_queue; the CPU computes
 * each at once): the same ids as the same draws run step by step, for two draws; ids that
 * are not the argmax's (the rows are used); and a row that asks for more than ids, each a
 * clear error. */
static void test_queued_sampled(atlas_model *m, const char *model, const prompt *pr) {
    enum { STEPS = 120 };
    static const atlas_sample_row draws[] = {
        {.seed = 1234, .temperature = 0.8f, .top_p = 0.95f, .top_k = 40,
         .repetition_penalty = 1.0f},
        {.seed = 99, .temperature = 1.3f, .top_p = 1.0f, .min_p = 0.02f,
         .repetition_penalty = 1.0f},
    };
    int32_t want[STEPS], got[STEPS], greedy[STEPS];
    seq s;
    next_block = 0;
    seq_init(&s);
    CHECK_OK(greedy_run(m, pr->ids, pr->n, s.table, BLOCK, STEPS, 0, greedy));
    for (size_t d = 0; d < sizeof draws / sizeof *draws; d++) {
        CHECK_OK(decode_run(m, pr->ids, pr->n, s.table, BLOCK, STEPS, 0, &draws[d], want));
        CHECK_OK(decode_run(m, pr->ids, pr->n, s.table, BLOCK, STEPS, 1, &draws[d], got));
        int same = 0, argmax = 0;
        while (same < STEPS && got[same] == want[same]) same++;
        while (argmax < STEPS && got[argmax] == greedy[argmax]) argmax++;
        CHECK_MSG(same == STEPS, "%s: draw %zu: queued sampled id %d of %d differs (%d, want %d)",
                  model, d, same, STEPS, same < STEPS ? got[same] : 0,
                  same < STEPS ? want[same] : 0);
        CHECK_MSG(argmax < STEPS, "%s: draw %zu: %d sampled ids, each the argmax", model, d,
                  STEPS);
        printf("%s: %d queued sampled steps (draw %zu) equal the steps run one by one; the "
               "first %d the argmax's\n", model, same, d, argmax);
    }
    int32_t tok = want[0], pos = 0, start[2] = {0, 1}, ctx = 1, row = 0;
    atlas_batch b = {.n_tokens = 1, .tokens = &tok, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = s.table,
                     .max_blocks = 1, .n_logits = 1, .logit_rows = &row};
    atlas_sample_row bad = draws[0];
    bad.flags = ATLAS_SAMPLE_LOGPROB;
    CHECK(atlas_model_forward_sample_queue(m, &b, &bad) == ATLAS_ERR_INVALID);
    bad = draws[0];
    bad.n_top = 2;
    CHECK(atlas_model_forward_sample_queue(m, &b, &bad) == ATLAS_ERR_INVALID);
    bad = draws[0];
    bad.top_p = 0.0f;
    CHECK(atlas_model_forward_sample_queue(m, &b, &bad) == ATLAS_ERR_INVALID);
    CHECK(atlas_model_forward_sample_queue(m, &b, NULL) == ATLAS_ERR_INVALID);
    int32_t id = -1;
    CHECK(atlas_model_argmax_collect(m, &id, 1) == ATLAS_ERR_INVALID); /* none was queued */
}

static void test_model(const char *name) {
    char dir[512], ref[600];
    snprintf(dir, sizeof dir, "%s/%s", harness_data_dir(), name);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(ref, &st));
    if (!st) return;
    atlas_model_params params = atlas_model_default_params();
    params.device = ATLAS_DEVICE_CPU;
    params.n_threads = 1; /* test_invariance compares against 3 threads */
    params.max_batch_tokens = 1024;
    params.load_tokenizer = 0;
    params.kv_block_size = BLOCK;
    params.kv_tokens = MAX_SEQS * MAX_BLOCKS * BLOCK;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &params, &m));
    if (!m) {
        atlas_st_free(st);
        return;
    }
    n_kv_blocks = atlas_model_kv_blocks(m);
    CHECK(n_kv_blocks == MAX_SEQS * MAX_BLOCKS);
    int V = atlas_model_vocab_size(m);
    prompt pr[MAX_SEQS];
    int n = 0;
    for (; n < MAX_SEQS; n++) {
        char key[64];
        snprintf(key, sizeof key, "p%d.ids", n);
        const atlas_tensor_view *ids = atlas_st_find(st, key);
        if (!ids) break;
        prompt *q = &pr[n];
        q->ids = ids->data;
        q->n = (int)ids->shape[0];
#define T(field, suffix) (snprintf(key, sizeof key, "p%d." suffix, n), q->field = tensor(st, key))
        T(last_logits, "last_logits");
        T(topk_ids, "topk_ids");
        T(topk_values, "topk_values");
        T(greedy_ids, "greedy_ids");
        T(greedy_margins, "greedy_margins");
#undef T
    }
    CHECK_MSG(n >= 7, "%s: %d prompts in the reference", name, n);
    for (int p = 0; p < n; p++) {
        next_block = 0;
        /* greedy alone for the shortest and the longest prompt; test_batch decodes all */
        test_single(m, name, p, &pr[p], V, p == 0 || p == n - 1);
        next_block = 0;
        test_chunked(m, name, p, &pr[p], V);
    }
    next_block = 0;
    test_batch(m, name, pr, n, V);
    test_invariance(dir, name, pr, n, m, ATLAS_CPU_ACT_FP32);
    /* bf16 activations and a bf16 KV cache: decode's direct attention and the bf16 kernels
     * keep the same property */
    params.cpu_activations = ATLAS_CPU_ACT_BF16;
    atlas_model *mb = NULL;
    CHECK_OK(atlas_model_load(dir, &params, &mb));
    if (mb) {
        test_invariance(dir, name, pr, n, mb, ATLAS_CPU_ACT_BF16);
        CHECK_OK(atlas_model_release(mb));
    }
    test_queued(m, name, &pr[0]);
    test_queued_sampled(m, name, &pr[0]);
    test_cli(name, &pr[0], "Hello, world!");
    CHECK_OK(atlas_model_release(m));
    atlas_st_free(st);
}

/* Logit rows in chunks: after the layers the logits live in gate_up's memory, as many rows
 * at a time as fit there (model.c alloc_acts). The default model (vocab 4096) with 64-token
 * buffers fits 18 rows a chunk; every row of a 60-token prompt must be bitwise what a model
 * with one chunk for all of them computes. */
static void test_logit_chunks(void) {
    const char *src = getenv("ATLAS_SOURCE_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/default", src ? src : ".");
    atlas_model_params params = atlas_model_default_params();
    params.device = ATLAS_DEVICE_CPU;
    params.n_threads = 2;
    params.load_tokenizer = 0;
    params.kv_block_size = BLOCK;
    params.kv_tokens = MAX_SEQS * MAX_BLOCKS * BLOCK;
    params.max_batch_tokens = 64;
    params.mlp_chunk_tokens = 64;
    atlas_model *small = NULL, *big = NULL;
    CHECK_OK(atlas_model_load(dir, &params, &small));
    params.max_batch_tokens = 1024;
    params.mlp_chunk_tokens = 1024;
    CHECK_OK(atlas_model_load(dir, &params, &big));
    if (!small || !big) return;
    CHECK_MSG(small->logits_in_gate_up && small->logit_chunk == 18,
              "default model, 64-token buffers: logit chunk %d (in gate_up: %d), want 18",
              small->logit_chunk, small->logits_in_gate_up);
    CHECK_MSG(big->logit_chunk >= 60, "default model, 1024-token buffers: logit chunk %d",
              big->logit_chunk);
    enum { N = 60 };
    int V = atlas_model_vocab_size(small);
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 131 + 7) % V);
    float *a = malloc(sizeof(float) * N * V), *b = malloc(sizeof(float) * N * V);
    seq s1, s2;
    seq_init(&s1);
    seq_init(&s2);
    seq *p1 = &s1, *p2 = &s2;
    const int32_t *chunk[] = {ids};
    int count[] = {N};
    CHECK_OK(feed(small, &p1, 1, chunk, count, 1, a));
    CHECK_OK(feed(big, &p2, 1, chunk, count, 1, b));
    int differ = 0;
    for (size_t i = 0; i < (size_t)N * V; i++) differ += a[i] != b[i];
    CHECK_MSG(differ == 0, "logits in chunks of 18 rows: %d of %d values differ from one chunk",
              differ, N * V);
    printf("default model: %d logit rows in chunks of %d equal one chunk of %d\n", N,
           small->logit_chunk, big->logit_chunk);
    free(a);
    free(b);
    CHECK_OK(atlas_model_release(small));
    CHECK_OK(atlas_model_release(big));
}

/* ---- biases: a checkpoint written here against a float64 forward --------------------------- */

typedef struct bias_fill {
    int zero_bias; /* every .bias tensor 0 */
} bias_fill;

/* Deterministic values from the name and the index: norms near 1, biases up to 0.5, the
 * rest in [-0.5, 0.5) (the embedding [-1, 1)). */
static float bias_value(void *user, const char *name, int64_t i) {
    const bias_fill *bf = user;
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= (uint64_t)i * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 32;
    float u = (float)((double)(h >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
    size_t len = strlen(name);
    if (len > 5 && !strcmp(name + len - 5, ".bias")) return bf->zero_bias ? 0.0f : 0.5f * u;
    if (strstr(name, "norm.weight")) return 1.0f + 0.25f * u;
    if (strstr(name, "embed_tokens")) return u;
    return 0.5f * u;
}

typedef struct ref_model {
    const atlas_config *c;
    bias_fill *fill;
} ref_model;

static double ref_val(const ref_model *r, const char *name, int64_t i) {
    return ckpt_bf16(bias_value(r->fill, name, i));
}

/* out[rows] = W[rows, cols] @ in (+ bias), W and bias named after "model.layers.L." */
static void ref_linear(const ref_model *r, int l, const char *w, const char *b, int rows,
                       int cols, const double *in, double *out) {
    char wn[128], bn[128];
    snprintf(wn, sizeof wn, "model.layers.%d.%s", l, w);
    snprintf(bn, sizeof bn, "model.layers.%d.%s", l, b ? b : "");
    for (int i = 0; i < rows; i++) {
        double acc = b ? ref_val(r, bn, i) : 0;
        for (int j = 0; j < cols; j++) acc += ref_val(r, wn, (int64_t)i * cols + j) * in[j];
        out[i] = acc;
    }
}

static void ref_rmsnorm(const ref_model *r, const char *w, const double *x, int d, double *out) {
    double ms = 0;
    for (int j = 0; j < d; j++) ms += x[j] * x[j];
    double inv = 1.0 / sqrt(ms / d + r->c->rms_eps);
    for (int j = 0; j < d; j++) out[j] = x[j] * inv * ref_val(r, w, j);
}

/* The logits of one token at position 0: attention over that one position is its v. */
static void ref_forward(const ref_model *r, int token, double *logits) {
    const atlas_config *c = r->c;
    enum { MAXW = 64 };
    int d = c->hidden, H = c->n_heads, K = c->n_kv_heads, hd = c->head_dim, f = c->intermediate;
    double x[MAXW], h[MAXW], v[MAXW], att[MAXW], o[MAXW], g[MAXW], u[MAXW];
    char nm[128];
    for (int j = 0; j < d; j++) x[j] = ref_val(r, "model.embed_tokens.weight", (int64_t)token * d + j);
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        ref_rmsnorm(r, nm, x, d, h);
        ref_linear(r, l, "self_attn.v_proj.weight", c->qkv_bias ? "self_attn.v_proj.bias" : NULL,
                   K * hd, d, h, v);
        for (int i = 0; i < H * hd; i++) att[i] = v[(i / hd) / (H / K) * hd + i % hd];
        ref_linear(r, l, "self_attn.o_proj.weight", c->o_bias ? "self_attn.o_proj.bias" : NULL,
                   d, H * hd, att, o);
        for (int j = 0; j < d; j++) x[j] += o[j];
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        ref_rmsnorm(r, nm, x, d, h);
        ref_linear(r, l, "mlp.gate_proj.weight", c->mlp_bias ? "mlp.gate_proj.bias" : NULL, f, d,
                   h, g);
        ref_linear(r, l, "mlp.up_proj.weight", c->mlp_bias ? "mlp.up_proj.bias" : NULL, f, d, h,
                   u);
        for (int i = 0; i < f; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        ref_linear(r, l, "mlp.down_proj.weight", c->mlp_bias ? "mlp.down_proj.bias" : NULL, d,
                   f, g, o);
        for (int j = 0; j < d; j++) x[j] += o[j];
    }
    ref_rmsnorm(r, "model.norm.weight", x, d, h);
    const char *head = c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (int t = 0; t < c->vocab_size; t++) {
        double acc = 0;
        for (int j = 0; j < d; j++) acc += ref_val(r, head, (int64_t)t * d + j) * h[j];
        logits[t] = acc;
    }
}

enum { BIAS_SEQS = 3 };

/* Logits of BIAS_SEQS one-token sequences in one batch (3 rows: the MLP in chunks of 2),
 * then of the first alone (the MLP whole), each checked against ref_forward. */
static void bias_forward(const char *dir, const char *what, bias_fill *fill, float *out) {
    static const int32_t tokens[BIAS_SEQS] = {3, 7, 11};
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.n_threads = 1;
    p.max_batch_tokens = 16;
    p.mlp_chunk_tokens = 2;
    p.kv_block_size = BLOCK;
    p.kv_tokens = BIAS_SEQS * BLOCK;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return;
    int V = m->cfg.vocab_size;
    int32_t pos[BIAS_SEQS] = {0}, start[BIAS_SEQS + 1], ctx[BIAS_SEQS], table[BIAS_SEQS],
            rows[BIAS_SEQS];
    for (int s = 0; s < BIAS_SEQS; s++) start[s] = rows[s] = table[s] = s, ctx[s] = 1;
    start[BIAS_SEQS] = BIAS_SEQS;
    atlas_batch b = {.n_tokens = BIAS_SEQS, .tokens = tokens, .positions = pos,
                     .n_seqs = BIAS_SEQS, .seq_start = start, .seq_ctx = ctx,
                     .block_table = table, .max_blocks = 1, .n_logits = BIAS_SEQS,
                     .logit_rows = rows};
    float *alone = malloc(sizeof(float) * V), *want = malloc(sizeof(float) * V);
    double *ref = malloc(sizeof(double) * V);
    CHECK_OK(atlas_model_forward(m, &b, out));
    b = (atlas_batch){.n_tokens = 1, .tokens = tokens, .positions = pos, .n_seqs = 1,
                      .seq_start = start, .seq_ctx = ctx, .block_table = table,
                      .max_blocks = 1, .n_logits = 1, .logit_rows = rows};
    CHECK_OK(atlas_model_forward(m, &b, alone));
    ref_model r = {.c = &m->cfg, .fill = fill};
    for (int s = 0; s <= BIAS_SEQS; s++) {
        const float *got = s < BIAS_SEQS ? out + (size_t)s * V : alone;
        ref_forward(&r, tokens[s < BIAS_SEQS ? s : 0], ref);
        for (int t = 0; t < V; t++) want[t] = (float)ref[t];
        double e = harness_rel_err(got, want, V);
        CHECK_MSG(e <= 1e-5, "%s: token %d%s: logits error %.3g against the float64 forward",
                  what, tokens[s < BIAS_SEQS ? s : 0], s < BIAS_SEQS ? " (batch)" : " (alone)",
                  e);
    }
    free(alone);
    free(want);
    free(ref);
    CHECK_OK(atlas_model_release(m));
}

static void test_biases(const char *what, const char *config) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "bias")) return;
    atlas_config c;
    CHECK_OK(atlas_config_parse(config, strlen(config), what, &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    CHECK(c.o_bias && c.n_layers == 2 && c.hidden <= 64 && c.intermediate <= 64);
    int V = c.vocab_size;
    float *with = calloc((size_t)BIAS_SEQS * V, sizeof(float));
    float *without = calloc((size_t)BIAS_SEQS * V, sizeof(float));
    bias_fill fill = {0};
    if (ckpt_write_text(dir, "config.json", config) &&
        ckpt_write_model(dir, &g, NULL, NULL, 0, bias_value, &fill))
        bias_forward(dir, what, &fill, with);
    fill.zero_bias = 1; /* the same checkpoint, its biases zeroed */
    if (ckpt_write_model(dir, &g, NULL, NULL, 0, bias_value, &fill))
        bias_forward(dir, what, &fill, without);
    double e = harness_rel_err(with, without, BIAS_SEQS * V);
    CHECK_MSG(e > 0.05, "%s: biases nonzero and zeroed give logits within %.3g", what, e);
    printf("%s: logits with the biases and without differ by %.3g (relative)\n", what, e);
    free(with);
    free(without);
    harness_rm_rf(dir);
}

int main(void) {
    test_biases("llama attention_bias + mlp_bias",
                "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 8, "
                "\"intermediate_size\": 12, \"num_attention_heads\": 2, "
                "\"num_key_value_heads\": 1, \"num_hidden_layers\": 2, \"vocab_size\": 16, "
                "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
                "\"tie_word_embeddings\": false, \"attention_bias\": true, "
                "\"mlp_bias\": true, \"hidden_act\": \"silu\"}");
    test_biases("qwen3 attention_bias",
                "{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 8, "
                "\"intermediate_size\": 12, \"num_attention_heads\": 4, "
                "\"num_key_value_heads\": 2, \"head_dim\": 4, \"num_hidden_layers\": 2, "
                "\"vocab_size\": 16, \"max_position_embeddings\": 64, "
                "\"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, "
                "\"attention_bias\": true}");
    test_model("tiny-llama3");
    test_model("tiny-qwen3");
    test_logit_chunks();
    return harness_finish();
}
