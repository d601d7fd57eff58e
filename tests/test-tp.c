/* test-tp.c — tensor parallelism's arithmetic through the real model code, on the CPU.
 *
 * Each tiny checkpoint of tests/data is loaded three times in one process: whole (tp_size
 * 1) and as ranks 0 and 1 of tp_size 2 (tiny-qwen3: 2 of its 4 heads and 1 of its 2 KV
 * heads per rank; tiny-llama3: 1 of its 2 heads, its one KV head replicated on both). The
 * ranks run the same batches in lock-step on two threads; their all-reduce is a stand-in
 * that sums the two ranks' partial activations (the arithmetic NCCL's sum does; a test
 * double, not a collective). Checks: the last-position logits of every reference prompt
 * equal the whole model's within 1e-5 relative and transformers' within 1e-4; greedy
 * continuations agree with the whole model and the reference; the all-reduce runs twice a
 * layer at tp_size 2 and never at tp_size 1; local geometry (KV bytes) and the errors of
 * impossible splits. Then a Llama checkpoint written here with every bias (q/k/v/o and the
 * MLP's): tp_size 2 equals tp_size 1 (the o_proj and down_proj biases are rank 0's, added
 * once before the sum; the gate/up biases split with their rows), and a Phi3 checkpoint whose
 * fused qkv_proj and gate_up_proj each rank takes its bands of (with partial rotary and
 * longrope crossed while decoding): tp_size 2 equals tp_size 1 again. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/model.h"
#include "ckpt.h"
#include "core/error.h"
#include "harness.h"
#include "model/forward.h"
#include "format/safetensors.h"

enum { MAX_BLOCKS = 40, BLOCK = 16, N_GREEDY = 24, WORLD = 2 };

/* --- the all-reduce stand-in: two ranks, a barrier with a deadline ------------------------ */

typedef struct group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned gen;
    int broken;          /* a rank timed out: every later wait fails at once */
    float *slot[WORLD];  /* each rank's partial sums, posted before the first wait */
    size_t count[WORLD];
    int calls[WORLD];
} group;

typedef struct rank_ctx {
    group *g;
    int rank;
    float *scratch;
    size_t cap;
} rank_ctx;

/* Both ranks arrive, or ATLAS_ERR_INTERNAL after 10 s (the other rank failed or hung). */
static atlas_status barrier(group *g) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&g->mu);
    unsigned gen = g->gen;
    if (++g->arrived == WORLD) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    }
    while (g->gen == gen && !g->broken)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT) g->broken = 1;
    int broken = g->broken && g->gen == gen;
    if (broken) pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return broken ? atlas_fail(ATLAS_ERR_INTERNAL, "all-reduce stand-in: the other rank did "
                               "not arrive") : ATLAS_OK;
}

/* x[count] = rank 0's + rank 1's, in that order on both ranks (so both get the same bits). */
static atlas_status sum_ranks(void *ctx, atlas_backend *be, void *x, size_t count) {
    rank_ctx *r = ctx;
    group *g = r->g;
    if (be->act_size != sizeof(float))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "stand-in all-reduce: fp32 activations only");
    ATLAS_TRY(be->ops->sync(be));
    if (count > r->cap) {
        free(r->scratch);
        r->scratch = malloc(count * sizeof(float));
        r->cap = r->scratch ? count : 0;
        if (!r->scratch) return atlas_fail(ATLAS_ERR_NOMEM, "stand-in all-reduce");
    }
    g->slot[r->rank] = x;
    g->count[r->rank] = count;
    g->calls[r->rank]++;
    ATLAS_TRY(barrier(g)); /* both posted */
    if (g->count[0] != g->count[1])
        return atlas_fail(ATLAS_ERR_INTERNAL, "stand-in all-reduce: counts %zu and %zu",
                          g->count[0], g->count[1]);
    for (size_t i = 0; i < count; i++) r->scratch[i] = g->slot[0][i] + g->slot[1][i];
    ATLAS_TRY(barrier(g)); /* both read: now each may overwrite its own x */
    memcpy(x, r->scratch, count * sizeof(float));
    return ATLAS_OK;
}

static atlas_status count_calls(void *ctx, atlas_backend *be, void *x, size_t count) {
    (void)be, (void)x, (void)count;
    ++*(int *)ctx;
    return ATLAS_OK;
}

/* --- a sequence and its batches ------------------------------------------------------------- */

typedef struct seq {
    int32_t table[MAX_BLOCKS];
    int ctx;
} seq;

typedef struct step {
    atlas_batch b;
    int32_t pos[1024], start[2], ctx[1], rows[1];
} step;

static void make_step(step *s, const seq *q, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) s->pos[i] = q->ctx + i;
    s->start[0] = 0;
    s->start[1] = n;
    s->ctx[0] = q->ctx + n;
    s->rows[0] = n - 1;
    s->b = (atlas_batch){.n_tokens = n, .tokens = ids, .positions = s->pos, .n_seqs = 1,
                         .seq_start = s->start, .seq_ctx = s->ctx, .block_table = q->table,
                         .max_blocks = MAX_BLOCKS, .n_logits = 1, .logit_rows = s->rows};
}

typedef struct worker {
    atlas_model *m;
    const atlas_batch *b;
    atlas_status st;
    char err[512];
} worker;

static void *run_rank1(void *arg) {
    worker *w = arg;
    w->st = atlas_model_forward_layers(w->m, w->b);
    if (w->st != ATLAS_OK) snprintf(w->err, sizeof w->err, "%s", atlas_last_error());
    return NULL;
}

/* One lock-step forward of the two ranks: rank 1 on a thread (layers only), rank 0 here
 * (logits, or the argmax id when ids is set). */
static atlas_status tp_forward(atlas_model *r0, atlas_model *r1, const atlas_batch *b,
                               float *logits, int32_t *ids) {
    worker w = {.m = r1, .b = b};
    pthread_t th;
    if (pthread_create(&th, NULL, run_rank1, &w))
        return atlas_fail(ATLAS_ERR_INTERNAL, "pthread_create");
    atlas_status st = ids ? atlas_model_forward_argmax(r0, b, ids)
                          : atlas_model_forward(r0, b, logits);
    pthread_join(th, NULL);
    if (st == ATLAS_OK && w.st != ATLAS_OK) {
        fprintf(stderr, "rank 1: %s\n", w.err);
        return w.st;
    }
    return st;
}

/* --- the checks ----------------------------------------------------------------------------- */

typedef struct models {
    atlas_model *whole, *r0, *r1;
    group g;
    rank_ctx ctx[WORLD];
    int whole_calls;
    int n_layers, V;
} models;

static atlas_status load(const char *dir, int rank, int size, atlas_model **out) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 1;
    p.max_batch_tokens = 1024;
    p.load_tokenizer = 0;
    p.kv_block_size = BLOCK;
    p.kv_tokens = MAX_BLOCKS * BLOCK;
    p.tp_rank = rank;
    p.tp_size = size;
    return atlas_model_load(dir, &p, out);
}

/* Prompt p's prefill on both, then greedy decoding when steps > 0. */
static void check_prompt(models *ms, const char *name, const atlas_st *ref, int p, int steps) {
    char key[64];
    snprintf(key, sizeof key, "p%d.ids", p);
    const atlas_tensor_view *idv = atlas_st_find(ref, key);
    snprintf(key, sizeof key, "p%d.last_logits", p);
    const atlas_tensor_view *lv = atlas_st_find(ref, key);
    snprintf(key, sizeof key, "p%d.greedy_ids", p);
    const atlas_tensor_view *gv = atlas_st_find(ref, key);
    snprintf(key, sizeof key, "p%d.greedy_margins", p);
    const atlas_tensor_view *mv = atlas_st_find(ref, key);
    CHECK_MSG(idv && lv && gv && mv, "%s: reference p%d incomplete", name, p);
    if (!idv || !lv || !gv || !mv) return;
    int V = ms->V, n = (int)idv->shape[0];
    seq q = {.ctx = 0};
    for (int i = 0; i < MAX_BLOCKS; i++) q.table[i] = (MAX_BLOCKS - 1 - i); /* not in order */
    step *s = malloc(sizeof *s);
    float *lw = malloc(sizeof(float) * V), *lt = malloc(sizeof(float) * V);
    make_step(s, &q, idv->data, n);
    int calls0 = ms->g.calls[0];
    CHECK_OK(atlas_model_forward(ms->whole, &s->b, lw));
    CHECK_OK(tp_forward(ms->r0, ms->r1, &s->b, lt, NULL));
    CHECK_MSG(ms->g.calls[0] - calls0 == 2 * ms->n_layers && ms->g.calls[1] == ms->g.calls[0],
              "%s p%d: %d all-reduces on rank 0, %d in all on rank 1 (want 2 per layer, %d)",
              name, p, ms->g.calls[0] - calls0, ms->g.calls[1], ms->n_layers);
    double e_whole = harness_rel_err(lt, lw, V), e_ref = harness_rel_err(lt, lv->data, V);
    CHECK_MSG(e_whole <= 1e-5, "%s p%d: tp=2 vs tp=1 logits error %.3g > 1e-5", name, p, e_whole);
    CHECK_MSG(e_ref <= 1e-4, "%s p%d: tp=2 vs reference error %.3g > 1e-4", name, p, e_ref);
    printf("%s p%d (%d tokens): tp=2 vs tp=1 %.2e, vs transformers %.2e (tp=1 %.2e)\n", name, p,
           n, e_whole, e_ref, harness_rel_err(lw, lv->data, V));
    q.ctx = n;
    const int32_t *gref = gv->data;
    const float *margin = mv->data;
    int32_t tok_w = harness_argmax(lw, V), tok_t = harness_argmax(lt, V), agree = 1;
    for (int i = 0; i < steps && agree; i++) {
        CHECK_MSG(tok_t == tok_w, "%s p%d greedy step %d: tp=2 %d, tp=1 %d", name, p, i, tok_t,
                  tok_w);
        if (margin[i] >= 1e-3f) /* below it a correct engine may pick the other token */
            CHECK_MSG(tok_t == gref[i], "%s p%d greedy step %d: %d, reference %d", name, p, i,
                      tok_t, gref[i]);
        agree = tok_t == tok_w && (margin[i] < 1e-3f || tok_t == gref[i]);
        int32_t in = tok_t;
        make_step(s, &q, &in, 1);
        CHECK_OK(atlas_model_forward_argmax(ms->whole, &s->b, &tok_w));
        CHECK_OK(tp_forward(ms->r0, ms->r1, &s->b, NULL, &tok_t));
        q.ctx++;
    }
    free(s);
    free(lw);
    free(lt);
}

static void check_errors(const char *dir, models *ms) {
    atlas_model *m = NULL;
    atlas_status st = load(dir, 0, 3, &m); /* 3 divides neither 4 nor 2 heads */
    CHECK(st == ATLAS_ERR_UNSUPPORTED && m == NULL);
    CHECK_MSG(strstr(atlas_last_error(), "tensor parallel size 3 does not divide") != NULL,
              "got: %s", atlas_last_error());
    st = load(dir, 2, 2, &m);
    CHECK(st == ATLAS_ERR_INVALID && m == NULL);
    CHECK_MSG(strstr(atlas_last_error(), "tp_rank 2, tp_size 2") != NULL, "got: %s",
              atlas_last_error());
    /* rank 1 holds no lm_head: logits are rank 0's */
    int32_t tok = 1, pos = 0, start[2] = {0, 1}, ctx = 1, row = 0, table[MAX_BLOCKS] = {0};
    atlas_batch b = {.n_tokens = 1, .tokens = &tok, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = table,
                     .max_blocks = MAX_BLOCKS, .n_logits = 1, .logit_rows = &row};
    float *logits = malloc(sizeof(float) * ms->V);
    st = atlas_model_forward(ms->r1, &b, logits);
    CHECK(st == ATLAS_ERR_INVALID);
    CHECK_MSG(strstr(atlas_last_error(), "rank 1 has no lm_head") != NULL, "got: %s",
              atlas_last_error());
    free(logits);
    /* a rank without any all-reduce fails at the first one instead of computing garbage */
    CHECK_OK(load(dir, 1, 2, &m));
    if (m) {
        st = atlas_model_forward_layers(m, &b);
        CHECK(st == ATLAS_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(atlas_last_error(), "no all-reduce") != NULL, "got: %s",
                  atlas_last_error());
        CHECK_OK(atlas_model_release(m));
    }
}

static void test_model(const char *name, int kv_split) {
    char dir[512], refpath[600];
    snprintf(dir, sizeof dir, "%s/%s", harness_data_dir(), name);
    snprintf(refpath, sizeof refpath, "%s/reference.safetensors", dir);
    atlas_st *ref = NULL;
    CHECK_OK(atlas_st_open_file(refpath, &ref));
    models ms = {0};
    pthread_mutex_init(&ms.g.mu, NULL);
    pthread_cond_init(&ms.g.cv, NULL);
    CHECK_OK(load(dir, 0, 1, &ms.whole));
    CHECK_OK(load(dir, 0, 2, &ms.r0));
    CHECK_OK(load(dir, 1, 2, &ms.r1));
    if (ref && ms.whole && ms.r0 && ms.r1) {
        atlas_model_info wi, i0, i1;
        atlas_model_get_info(ms.whole, &wi);
        atlas_model_get_info(ms.r0, &i0);
        atlas_model_get_info(ms.r1, &i1);
        ms.n_layers = wi.n_layers;
        ms.V = wi.vocab_size;
        /* KV heads split (qwen3: 2 -> 1 a rank) or replicated (llama3: 1 on both) */
        CHECK_MSG(i1.kv_bytes * (kv_split ? 2 : 1) == wi.kv_bytes && i0.kv_bytes == i1.kv_bytes,
                  "%s: kv bytes %zu / %zu, whole %zu", name, i0.kv_bytes, i1.kv_bytes,
                  wi.kv_bytes);
        CHECK_MSG(i1.weight_bytes < wi.weight_bytes && i0.weight_bytes < wi.weight_bytes,
                  "%s: weight bytes %zu / %zu, whole %zu", name, i0.weight_bytes,
                  i1.weight_bytes, wi.weight_bytes);
        printf("%s: weights whole %zu B, rank 0 %zu B, rank 1 %zu B; KV %zu / %zu / %zu B\n",
               name, wi.weight_bytes, i0.weight_bytes, i1.weight_bytes, wi.kv_bytes,
               i0.kv_bytes, i1.kv_bytes);
        for (int r = 0; r < WORLD; r++) ms.ctx[r] = (rank_ctx){.g = &ms.g, .rank = r};
        atlas_model_set_all_reduce(ms.r0, sum_ranks, &ms.ctx[0]);
        atlas_model_set_all_reduce(ms.r1, sum_ranks, &ms.ctx[1]);
        /* at tp_size 1 the hook is never called */
        atlas_model_set_all_reduce(ms.whole, count_calls, &ms.whole_calls);
        int n = 0;
        for (char key[32]; snprintf(key, sizeof key, "p%d.ids", n), atlas_st_find(ref, key);)
            n++;
        CHECK_MSG(n >= 7, "%s: %d prompts in the reference", name, n);
        for (int p = 0; p < n; p++) check_prompt(&ms, name, ref, p, p == 0 || p == n - 1 ? N_GREEDY : 0);
        CHECK_MSG(ms.whole_calls == 0, "%s: tp=1 called the all-reduce %d times", name,
                  ms.whole_calls);
        check_errors(dir, &ms);
    }
    CHECK_OK(atlas_model_release(ms.whole));
    CHECK_OK(atlas_model_release(ms.r0));
    CHECK_OK(atlas_model_release(ms.r1));
    for (int r = 0; r < WORLD; r++) free(ms.ctx[r].scratch);
    pthread_cond_destroy(&ms.g.cv);
    pthread_mutex_destroy(&ms.g.mu);
    atlas_st_free(ref);
}

static float bias_value(void *user, const char *name, int64_t i) {
    (void)user;
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
    float u = (float)((double)(h >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
    return strstr(name, "norm.weight") ? 1.0f + 0.25f * u : 0.5f * u;
}

static void test_written(const char *what, const char *config) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "tp-bias")) return;
    atlas_config c;
    CHECK_OK(atlas_config_parse(config, strlen(config), "tp-bias", &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    models ms = {0};
    pthread_mutex_init(&ms.g.mu, NULL);
    pthread_cond_init(&ms.g.cv, NULL);
    if (ckpt_write_text(dir, "config.json", config) &&
        ckpt_write_model(dir, &g, NULL, NULL, 0, bias_value, NULL)) {
        CHECK_OK(load(dir, 0, 1, &ms.whole));
        CHECK_OK(load(dir, 0, 2, &ms.r0));
        CHECK_OK(load(dir, 1, 2, &ms.r1));
    }
    if (ms.whole && ms.r0 && ms.r1) {
        for (int r = 0; r < WORLD; r++) ms.ctx[r] = (rank_ctx){.g = &ms.g, .rank = r};
        atlas_model_set_all_reduce(ms.r0, sum_ranks, &ms.ctx[0]);
        atlas_model_set_all_reduce(ms.r1, sum_ranks, &ms.ctx[1]);
        enum { V = 64, N = 9, STEPS = 6 };
        int32_t ids[N];
        for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 17 + 5) % V);
        seq q = {.ctx = 0};
        for (int i = 0; i < MAX_BLOCKS; i++) q.table[i] = i;
        step *s = malloc(sizeof *s);
        float lw[V], lt[V];
        make_step(s, &q, ids, N);
        for (int i = 0; i <= STEPS; i++) {
            CHECK_OK(atlas_model_forward(ms.whole, &s->b, lw));
            CHECK_OK(tp_forward(ms.r0, ms.r1, &s->b, lt, NULL));
            double e = harness_rel_err(lt, lw, V);
            CHECK_MSG(e <= 1e-5, "%s, step %d: tp=2 vs tp=1 logits error %.3g", what, i, e);
            if (i == STEPS) break;
            q.ctx += s->b.n_tokens;
            ids[0] = harness_argmax(lw, V);
            make_step(s, &q, ids, 1);
        }
        printf("%s: tp=2 equals tp=1 over a %d-token prompt and %d steps\n", what, N, STEPS);
        free(s);
    }
    CHECK_OK(atlas_model_release(ms.whole));
    CHECK_OK(atlas_model_release(ms.r0));
    CHECK_OK(atlas_model_release(ms.r1));
    for (int r = 0; r < WORLD; r++) free(ms.ctx[r].scratch);
    pthread_cond_destroy(&ms.g.cv);
    pthread_mutex_destroy(&ms.g.mu);
    harness_rm_rf(dir);
}

int main(void) {
    test_model("tiny-qwen3", 1);
    test_model("tiny-llama3", 0);
    test_written("biases",
                 "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 16, "
                 "\"intermediate_size\": 32, \"num_attention_heads\": 4, "
                 "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 64, "
                 "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, "
                 "\"tie_word_embeddings\": false, \"attention_bias\": true, "
                 "\"mlp_bias\": true}");
    /* Phi3's fused qkv_proj and gate_up_proj, each rank taking its bands of them; partial
     * rotary and longrope past 12 tokens, which the decode steps cross */
    test_written("phi3 fused",
                 "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 32, "
                 "\"intermediate_size\": 32, \"num_attention_heads\": 4, "
                 "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 64, "
                 "\"max_position_embeddings\": 48, \"original_max_position_embeddings\": 12, "
                 "\"partial_rotary_factor\": 0.5, \"tie_word_embeddings\": true, "
                 "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0, 1.5], "
                 "\"long_factor\": [4.0, 9.0]}}");
    return harness_finish();
}
