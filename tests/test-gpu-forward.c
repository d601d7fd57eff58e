/* test-gpu-forward.c — the model on the CUDA backend end to end:
 * - tiny fixtures (tests/data/tiny-*): last-position logits of every prompt within 2e-2 of
 *   transformers' reference (max abs diff / max abs) and of the CPU backend; the greedy
 *   continuation (argmax on the GPU, decode steps replayed as CUDA graphs) equal to the
 *   reference up to the first step whose margin is < 1e-2 (GPU_MARGIN); all prompts as one batch and their
 *   continuations decoded together; the same greedy run with graphs off gives the same ids;
 *   every prompt again on a model made the other way (ALT: no programmatic dependent
 *   launch, no cuBLASLt, the one-row GEMVs on gemv1c / qgemv1c with 3 row groups a block,
 *   which these small shapes do not take by default);
 *   greedy steps queued a step ahead (tokens read on the GPU) equal to token-by-token
 *   argmax over 300 steps, across a growth of the staged block table; two queued steps of
 *   more logit rows than the logits buffer holds equal to the same steps run at once.
 * - a larger random model when ATLAS_TEST_BIG_MODEL names one (tools/make_checkpoint.py,
 *   made on the GPU machine): CPU and GPU logits within 2e-2 after a prefill and at every
 *   decode step, greedy ids equal where the CPU's margin is clear; the same for a GPU model
 *   made the other way (ALT).
 * Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "backend/cuda/cuda_backend.h"
#include "greedy.h"
#include "harness.h"
#include "model/forward.h"
#include "format/safetensors.h"

enum { MAX_SEQS = 8, MAX_BLOCKS = 48, BLOCK = 16, N_GREEDY = 24 };

/* The second GPU model's backend: the diagnostics off, and its one-row GEMVs (bf16 and
 * quantized) fixed at 3 row groups a block (set after the load, read at each launch). */
static const atlas_backend_options ALT = {.no_pdl = 1, .no_cublaslt = 1};
enum { ALT_NG = 3 };
#define ALT_NAME "no PDL, no cuBLASLt, gemv1c ng 3"

typedef struct seq {
    int32_t table[MAX_BLOCKS];
    int ctx;
} seq;

static int next_block, n_kv_blocks;

static void seq_init(seq *s) { /* scrambled blocks: (i * 37) mod n, n coprime to 37 */
    memset(s, 0, sizeof *s);
    for (int i = 0; i < MAX_BLOCKS; i++) s->table[i] = (int32_t)((next_block++ * 37) % n_kv_blocks);
}

/* One batch of n_seqs sequences, count[s] tokens each; logits (or ids) of each's last token. */
static atlas_status feed(atlas_model *m, seq **seqs, int n_seqs, const int32_t *const *chunk,
                         const int *count, float *logits, int32_t *ids) {
    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += count[s];
    int32_t *tokens = malloc(4 * (size_t)total), *pos = malloc(4 * (size_t)total);
    int32_t rows[MAX_SEQS], start[MAX_SEQS + 1], ctx[MAX_SEQS], table[MAX_SEQS * MAX_BLOCKS];
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        start[s] = t;
        for (int i = 0; i < count[s]; i++, t++) {
            tokens[t] = chunk[s][i];
            pos[t] = seqs[s]->ctx + i;
        }
        rows[s] = t - 1;
        ctx[s] = seqs[s]->ctx + count[s];
        memcpy(table + s * MAX_BLOCKS, seqs[s]->table, sizeof seqs[s]->table);
    }
    start[n_seqs] = t;
    atlas_batch b = {.n_tokens = total, .tokens = tokens, .positions = pos, .n_seqs = n_seqs,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table,
                     .max_blocks = MAX_BLOCKS, .n_logits = n_seqs, .logit_rows = rows};
    atlas_status st = logits ? atlas_model_forward(m, &b, logits)
                             : atlas_model_forward_argmax(m, &b, ids);
    if (st == ATLAS_OK)
        for (int s = 0; s < n_seqs; s++) seqs[s]->ctx = ctx[s];
    free(tokens);
    free(pos);
    return st;
}

/* opts: the CUDA backend's (NULL: defaults; ALT: also its GEMVs at ALT_NG). */
static atlas_model *load_with(const char *dir, atlas_device dev, int kv_tokens,
                              const atlas_backend_options *opts) {
    atlas_model_params p = atlas_model_default_params();
    p.device = dev;
    p.n_threads = 0;
    p.max_batch_tokens = 1024;
    p.load_tokenizer = 0;
    p.kv_block_size = BLOCK;
    p.kv_tokens = kv_tokens;
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load_opts(dir, &p, opts, &m);
    CHECK_MSG(st == ATLAS_OK, "loading %s on %s: %s", dir, dev == ATLAS_DEVICE_CPU ? "cpu" : "cuda",
              atlas_last_error());
    if (m && opts == &ALT) {
        ((cuda_backend *)atlas_model_backend(m))->plan.gemv_ng = ALT_NG;
        ((cuda_backend *)atlas_model_backend(m))->plan.qgemv_ng = ALT_NG;
    }
    return m;
}

static atlas_model *load(const char *dir, atlas_device dev, int kv_tokens) {
    return load_with(dir, dev, kv_tokens, NULL);
}

typedef struct prompt {
    const int32_t *ids, *greedy;
    const float *last, *margins;
    int n;
} prompt;

/* The GPU's logits differ from the reference by up to ~1e-2 (bf16 weights and KV cache;
 * |logits| <= 2.5 on the fixtures): a step whose reference margin is below that may pick
 * the other token, and everything after may differ. */
#define GPU_MARGIN 1e-2f

static void check_greedy(const char *what, const prompt *pr, const int32_t *got) {
    for (int i = 0; i < N_GREEDY; i++) {
        if (pr->margins[i] < GPU_MARGIN) break;
        CHECK_MSG(got[i] == pr->greedy[i], "%s greedy step %d: got %d, want %d", what, i, got[i],
                  pr->greedy[i]);
        if (got[i] != pr->greedy[i]) break;
    }
}

/* Prefill (logits checked against the reference and the CPU), then greedy by argmax. */
static void run_single(atlas_model *g, atlas_model *c, const char *name, int p, const prompt *pr,
                       int V, int32_t *gen) {
    seq sg, sc;
    next_block = 0;
    seq_init(&sg);
    next_block = 0;
    seq_init(&sc);
    seq *pg = &sg, *pc = &sc;
    float *lg = malloc(4 * (size_t)V), *lc = malloc(4 * (size_t)V);
    CHECK_OK(feed(g, &pg, 1, &pr->ids, &pr->n, lg, NULL));
    double e_ref = harness_rel_err(lg, pr->last, V), e_cpu = 0;
    if (c) {
        CHECK_OK(feed(c, &pc, 1, &pr->ids, &pr->n, lc, NULL));
        e_cpu = harness_rel_err(lg, lc, V);
        CHECK_MSG(e_cpu <= 2e-2, "%s p%d: gpu vs cpu last logits %.3g > 2e-2", name, p, e_cpu);
    }
    CHECK_MSG(e_ref <= 2e-2, "%s p%d: last logits error %.3g > 2e-2", name, p, e_ref);
    printf("%s p%d (%d tokens): vs reference %.2e, vs cpu %.2e\n", name, p, pr->n, e_ref, e_cpu);
    int32_t next = harness_argmax(lg, V);
    for (int i = 0; i < N_GREEDY; i++) {
        gen[i] = next;
        int one = 1;
        const int32_t *tok = &gen[i];
        CHECK_OK(feed(g, &pg, 1, &tok, &one, NULL, &next));
    }
    char what[64];
    snprintf(what, sizeof what, "%s p%d", name, p);
    check_greedy(what, pr, gen);
    free(lg);
    free(lc);
}

static void run_batch(atlas_model *g, const char *name, const prompt *pr, int n, int V) {
    seq s[MAX_SEQS], *sp[MAX_SEQS];
    const int32_t *chunk[MAX_SEQS];
    int count[MAX_SEQS];
    int32_t gen[MAX_SEQS][N_GREEDY], ids[MAX_SEQS];
    float *logits = malloc(4 * (size_t)V * n);
    next_block = 0;
    for (int i = 0; i < n; i++) {
        seq_init(&s[i]);
        sp[i] = &s[i];
        chunk[i] = pr[i].ids;
        count[i] = pr[i].n;
    }
    CHECK_OK(feed(g, sp, n, chunk, count, logits, NULL));
    for (int i = 0; i < n; i++) {
        double e = harness_rel_err(logits + (size_t)i * V, pr[i].last, V);
        CHECK_MSG(e <= 2e-2, "%s batch seq %d: last logits error %.3g", name, i, e);
        ids[i] = harness_argmax(logits + (size_t)i * V, V);
    }
    for (int step = 0; step < N_GREEDY; step++) {
        for (int i = 0; i < n; i++) {
            gen[i][step] = ids[i];
            chunk[i] = &gen[i][step];
            count[i] = 1;
        }
        CHECK_OK(feed(g, sp, n, chunk, count, NULL, ids));
    }
    for (int i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s batch seq %d", name, i);
        check_greedy(what, &pr[i], gen[i]);
    }
    free(logits);
}

/* Greedy steps queued a step ahead, each one's token the step before's argmax read on the
 * GPU (atlas_model_forward_argmax_queue), against token-by-token argmax on the same model:
 * the same ids (the same kernels). On a fresh model the staged block table grows past 16
 * blocks while a step is queued (its buffers made again: the queued ids come back through
 * the host). */
static void run_queued(atlas_model *g, const char *name, const int32_t *prompt, int n,
                       int steps) {
    int32_t *want = malloc(4 * (size_t)steps), *got = malloc(4 * (size_t)steps);
    seq s;
    next_block = 0;
    seq_init(&s);
    CHECK_OK(greedy_run(g, prompt, n, s.table, BLOCK, steps, 1, got));
    CHECK_OK(greedy_run(g, prompt, n, s.table, BLOCK, steps, 0, want));
    int same = 0;
    while (same < steps && got[same] == want[same]) same++;
    CHECK_MSG(same == steps, "%s: queued greedy id %d of %d differs (%d, want %d)", name, same,
              steps, same < steps ? got[same] : 0, same < steps ? want[same] : 0);
    printf("%s: %d queued greedy steps (to position %d) equal token-by-token argmax\n", name,
           same, n + steps - 1);
    free(want);
    free(got);
}

/* A queued step of more logit rows than the logits buffer holds (model.c's logit_chunk: 16
 * for the tiny fixtures), computed a chunk at a time: W one-token sequences, two steps queued
 * (the second's tokens the first's ids, read on the GPU, in another order than the rows, and
 * every fifth a token from the host, as a step that rows join and leave has them), the same
 * ids as the two steps run one by one. */
static void run_queued_wide(atlas_model *g, const char *name, int V) {
    enum { W = 40 };
    int32_t tok[W], pos[W], start[W + 1], ctx[W], rows[W], table[W], a[W], b2[W], qa[W], qb[W];
    int32_t next[W], prev[W];
    for (int i = 0; i < W; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % V);
        start[i] = rows[i] = table[i] = i;
        pos[i] = 0, ctx[i] = 1;
    }
    start[W] = W;
    atlas_batch b = {.n_tokens = W, .tokens = tok, .positions = pos, .n_seqs = W,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table,
                     .max_blocks = 1, .n_logits = W, .logit_rows = rows};
    CHECK_OK(atlas_model_forward_argmax(g, &b, a));
    for (int i = 0; i < W; i++) {
        int from = (i * 17 + 3) % W; /* a permutation: W is not a multiple of 17 */
        pos[i] = 1, ctx[i] = 2;
        next[i] = i % 5 ? a[from] : tok[(i + 1) % W];
        prev[i] = i % 5 ? ATLAS_BATCH_PREV(from) : tok[(i + 1) % W];
    }
    b.tokens = next;
    CHECK_OK(atlas_model_forward_argmax(g, &b, b2));
    for (int i = 0; i < W; i++) pos[i] = 0, ctx[i] = 1;
    b.tokens = tok;
    CHECK_OK(atlas_model_forward_argmax_queue(g, &b));
    for (int i = 0; i < W; i++) pos[i] = 1, ctx[i] = 2;
    b.tokens = prev;
    CHECK_OK(atlas_model_forward_argmax_queue(g, &b));
    CHECK_OK(atlas_model_argmax_collect(g, qa, W));
    CHECK_OK(atlas_model_argmax_collect(g, qb, W));
    CHECK_MSG(!memcmp(a, qa, sizeof a) && !memcmp(b2, qb, sizeof b2),
              "%s: a queued step of %d rows differs from the same step run at once", name, W);
    printf("%s: two queued steps of %d logit rows equal the steps run at once\n", name, W);
}

/* Sampled steps queued a step ahead (atlas_model_forward_sample_queue, kernels/sample.cu's
 * atlas_sample_ids): one sequence's draws against the same draws run one by one through
 * the sample op, ids not all the argmax's; then W one-token sequences, greedy and sampled
 * rows in one step (temperature 0 is the argmax), two steps queued a chunk at a time, the
 * same ids as the two steps run at once. */
static void run_queued_sampled(atlas_model *g, const char *name, const int32_t *prompt, int n,
                               int V) {
    enum { STEPS = 120, W = 40 };
    const atlas_sample_row draw = {.seed = 77, .temperature = 0.9f, .top_p = 0.9f,
                                   .top_k = 50, .repetition_penalty = 1.0f};
    int32_t want[STEPS], got[STEPS], greedy[STEPS];
    seq s;
    next_block = 0;
    seq_init(&s);
    CHECK_OK(decode_run(g, prompt, n, s.table, BLOCK, STEPS, 1, &draw, got));
    CHECK_OK(decode_run(g, prompt, n, s.table, BLOCK, STEPS, 0, &draw, want));
    CHECK_OK(greedy_run(g, prompt, n, s.table, BLOCK, STEPS, 0, greedy));
    int same = 0, argmax = 0;
    while (same < STEPS && got[same] == want[same]) same++;
    while (argmax < STEPS && got[argmax] == greedy[argmax]) argmax++;
    CHECK_MSG(same == STEPS, "%s: queued sampled id %d of %d differs (%d, want %d)", name, same,
              STEPS, same < STEPS ? got[same] : 0, same < STEPS ? want[same] : 0);
    CHECK_MSG(argmax < STEPS, "%s: %d sampled ids, each the argmax", name, STEPS);

    int32_t tok[W], pos[W], start[W + 1], ctx[W], rows[W], table[W], a[W], b2[W], qa[W], qb[W];
    atlas_sample_row r[W];
    atlas_sample_out out[W];
    for (int i = 0; i < W; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % V);
        start[i] = rows[i] = table[i] = i;
        pos[i] = 0, ctx[i] = 1;
        r[i] = (atlas_sample_row){.seed = 1000u + (uint64_t)i, .counter = 1,
                                  .temperature = i % 3 ? 0.7f + 0.05f * (float)(i % 5) : 0.0f,
                                  .top_p = i % 2 ? 0.9f : 1.0f, .min_p = i % 4 ? 0.0f : 0.05f,
                                  .repetition_penalty = 1.0f, .top_k = i % 7 ? 0 : 20};
    }
    start[W] = W;
    atlas_batch b = {.n_tokens = W, .tokens = tok, .positions = pos, .n_seqs = W,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table,
                     .max_blocks = 1, .n_logits = W, .logit_rows = rows};
    atlas_model_sampling smp = {.rows = r, .out = out};
    CHECK_OK(atlas_model_forward_sample(g, &b, &smp));
    for (int i = 0; i < W; i++) a[i] = out[i].id, pos[i] = 1, ctx[i] = 2, r[i].counter = 2;
    b.tokens = a;
    CHECK_OK(atlas_model_forward_sample(g, &b, &smp));
    for (int i = 0; i < W; i++) b2[i] = out[i].id, pos[i] = 0, ctx[i] = 1, r[i].counter = 1;
    b.tokens = tok;
    CHECK_OK(atlas_model_forward_sample_queue(g, &b, r));
    int32_t prev[W];
    for (int i = 0; i < W; i++)
        pos[i] = 1, ctx[i] = 2, r[i].counter = 2, prev[i] = ATLAS_BATCH_PREV(i);
    b.tokens = prev;
    CHECK_OK(atlas_model_forward_sample_queue(g, &b, r));
    CHECK_OK(atlas_model_argmax_collect(g, qa, W));
    CHECK_OK(atlas_model_argmax_collect(g, qb, W));
    CHECK_MSG(!memcmp(a, qa, sizeof a) && !memcmp(b2, qb, sizeof b2),
              "%s: a queued sampled step of %d rows differs from the same step run at once",
              name, W);
    printf("%s: %d queued sampled steps equal the draws run one by one (the first %d the "
           "argmax's); two queued steps of %d greedy and sampled rows equal them run at once\n",
           name, same, argmax, W);
}

static void test_fixture(const char *name) {
    char dir[512], ref[600];
    snprintf(dir, sizeof dir, "%s/%s", harness_data_dir(), name);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(ref, &st));
    int kv = MAX_SEQS * MAX_BLOCKS * BLOCK;
    atlas_model *g = load(dir, ATLAS_DEVICE_CUDA, kv), *c = load(dir, ATLAS_DEVICE_CPU, kv);
    if (!st || !g || !c) goto out;
    n_kv_blocks = atlas_model_kv_blocks(g);
    int V = atlas_model_vocab_size(g);
    prompt pr[MAX_SEQS];
    int n = 0;
    for (; n < MAX_SEQS; n++) {
        char key[64];
        const atlas_tensor_view *v[5];
        const char *f[] = {"ids", "last_logits", "greedy_ids", "greedy_margins"};
        for (int i = 0; i < 4; i++) {
            snprintf(key, sizeof key, "p%d.%s", n, f[i]);
            v[i] = atlas_st_find(st, key);
        }
        if (!v[0] || !v[1] || !v[2] || !v[3]) break;
        pr[n] = (prompt){v[0]->data, v[2]->data, v[1]->data, v[3]->data, (int)v[0]->shape[0]};
    }
    CHECK_MSG(n >= 7, "%s: %d prompts", name, n);
    int32_t gen0[N_GREEDY];
    for (int p = 0; p < n; p++) {
        int32_t gen[N_GREEDY];
        run_single(g, c, name, p, &pr[p], V, gen);
        if (p == 0) memcpy(gen0, gen, sizeof gen);
    }
    run_batch(g, name, pr, n, V);
    atlas_model_release(g);
    g = load(dir, ATLAS_DEVICE_CUDA, kv);
    if (g) run_queued(g, name, pr[0].ids, pr[0].n, 300);
    if (g) run_queued_wide(g, name, V);
    if (g) run_queued_sampled(g, name, pr[0].ids, pr[0].n, V);
    /* graphs off: the same greedy ids (same kernels, so the same logits) */
    atlas_model_release(g);
    const atlas_backend_options no_graphs = {.no_graphs = 1};
    g = load_with(dir, ATLAS_DEVICE_CUDA, kv, &no_graphs);
    if (g) {
        int32_t gen[N_GREEDY];
        run_single(g, NULL, name, 0, &pr[0], V, gen);
        CHECK_MSG(!memcmp(gen, gen0, sizeof gen), "%s: greedy ids differ with graphs off", name);
    }
    /* the model made the other way (ALT), checked against the reference and the CPU as above
     * (both fuse: tiny-llama3 has head_dim 8, so its qkv GEMV ropes and stores k/v in its
     * epilogue; Qwen3's qk_norm keeps that one apart) */
    atlas_model_release(g);
    g = load_with(dir, ATLAS_DEVICE_CUDA, kv, &ALT);
    if (g) {
        char fused_name[96];
        snprintf(fused_name, sizeof fused_name, "%s (" ALT_NAME ")", name);
        for (int p = 0; p < n; p++) {
            int32_t gen[N_GREEDY];
            run_single(g, c, fused_name, p, &pr[p], V, gen);
        }
    }
out:
    CHECK_OK(atlas_model_release(g));
    CHECK_OK(atlas_model_release(c));
    atlas_st_free(st);
}

/* CPU vs GPU on a larger random checkpoint (head_dim 128, real GEMV lengths); a second GPU
 * model made the other way (ALT) follows the same tokens. */
static void test_big(const char *dir) {
    enum { N_PROMPT = 100, N_STEPS = 12 };
    int kv = MAX_BLOCKS * BLOCK;
    atlas_model *g = load(dir, ATLAS_DEVICE_CUDA, kv), *c = load(dir, ATLAS_DEVICE_CPU, kv);
    atlas_model *f = load_with(dir, ATLAS_DEVICE_CUDA, kv, &ALT);
    if (g && c && f) {
        n_kv_blocks = atlas_model_kv_blocks(g);
        int V = atlas_model_vocab_size(g);
        int32_t ids[N_PROMPT];
        for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)((i * 2654435761u) % (unsigned)V);
        seq sg, sc, sf;
        seq *ps[3] = {&sg, &sc, &sf};
        atlas_model *ms[3] = {g, c, f};
        float *lg = malloc(4 * (size_t)V), *lc = malloc(4 * (size_t)V), *lf = malloc(4 * (size_t)V);
        float *out[3] = {lg, lc, lf};
        const int32_t *chunk = ids;
        int count = N_PROMPT;
        for (int i = 0; i < 3; i++) {
            next_block = 0;
            seq_init(ps[i]);
            CHECK_OK(feed(ms[i], &ps[i], 1, &chunk, &count, out[i], NULL));
        }
        for (int step = 0; step <= N_STEPS; step++) {
            double e = harness_rel_err(lg, lc, V), ef = harness_rel_err(lf, lc, V);
            int ag = harness_argmax(lg, V), ac = harness_argmax(lc, V), af = harness_argmax(lf, V);
            float best = lc[ac], second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != ac && lc[i] > second) second = lc[i];
            printf("big step %d: gpu vs cpu %.2e, alt gpu vs cpu %.2e, argmax %d / %d / %d "
                   "(cpu margin %.3g)\n", step, e, ef, ag, af, ac, best - second);
            CHECK_MSG(e <= 2e-2, "big model step %d: gpu vs cpu logits %.3g > 2e-2", step, e);
            CHECK_MSG(ef <= 2e-2, "big model step %d: alt gpu vs cpu logits %.3g > 2e-2", step,
                      ef);
            if (best - second > 2e-2 * fabsf(best)) {
                CHECK_MSG(ag == ac, "big step %d argmax", step);
                CHECK_MSG(af == ac, "big step %d argmax (alt kernels)", step);
            }
            int32_t next = ac; /* all continue with the CPU's choice */
            const int32_t *tok = &next;
            int one = 1;
            for (int i = 0; i < 3; i++) CHECK_OK(feed(ms[i], &ps[i], 1, &tok, &one, out[i], NULL));
        }
        free(lg);
        free(lc);
        free(lf);
        run_queued(g, "big", ids, N_PROMPT, 40);
    }
    CHECK_OK(atlas_model_release(g));
    CHECK_OK(atlas_model_release(c));
    CHECK_OK(atlas_model_release(f));
}

int main(void) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    atlas_model *probe = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-qwen3", harness_data_dir());
    atlas_status st = atlas_model_load(dir, &p, &probe);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    CHECK_OK(atlas_model_release(probe));
    test_fixture("tiny-llama3");
    test_fixture("tiny-qwen3");
    const char *big = getenv("ATLAS_TEST_BIG_MODEL");
    if (big && *big) test_big(big);
    else printf("big model: skipped (set ATLAS_TEST_BIG_MODEL to a checkpoint directory)\n");
    return harness_finish();
}
