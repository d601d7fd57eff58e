/* test-embed.c — what makes a model an embedding model, and the forward's hidden-state rows.
 * - The hidden rows (atlas_batch.hidden) are the final-norm states the output head reads: on
 *   a tied checkpoint (tests/data/small/qk-norm), every row's logits equal its hidden row
 *   times the embedding table, computed here from the file's bf16 values.
 * - Directories read as sentence-transformers lays them out: pooling mean, last token and
 *   cls, Normalize, Matryoshka widths, and each refusal by name: another pooling mode, two
 *   modes, include_prompt false, a Dense module, no Pooling module, a Qwen3Model without
 *   modules.json, bidirectional attention (is_causal false, use_bidirectional_attention, a
 *   gte-Qwen2 name).
 * - The engine, before any load: embedding_info, the models file's Matryoshka widths (and
 *   their refusals), and which requests each kind of model takes.
 * The server's tests (tests/server/embeddings.test.mjs) run the pooling. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "ckpt.h"
#include "core/dtype.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "harness.h"
#include "model/config.h"
#include "model/forward.h"

enum { N = 7, BLOCKS = 4 };

/* One sequence of N tokens, every row asked for: its logits, or its hidden states. */
static atlas_status run(atlas_model *m, int hidden, float *out) {
    int32_t tokens[N], pos[N], rows[N], start[2] = {0, N}, ctx[1] = {N}, table[BLOCKS];
    for (int i = 0; i < N; i++) tokens[i] = (i * 53 + 11) % 256, pos[i] = i, rows[i] = i;
    for (int i = 0; i < BLOCKS; i++) table[i] = BLOCKS - 1 - i;
    atlas_batch b = {.n_tokens = N, .tokens = tokens, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table,
                     .max_blocks = BLOCKS, .n_logits = N, .logit_rows = rows, .hidden = hidden};
    return atlas_model_forward(m, &b, out);
}

static void test_hidden_rows(void) {
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/small/qk-norm", harness_data_dir());
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 1;
    p.load_tokenizer = 0;
    p.kv_tokens = BLOCKS * 16;
    atlas_model *m = NULL;
    atlas_st *st = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    CHECK_OK(atlas_st_open_file(file, &st));
    if (!m || !st) return;
    const atlas_tensor_view *emb = atlas_st_find(st, "model.embed_tokens.weight");
    CHECK(emb && emb->dtype == ATLAS_DTYPE_BF16);
    int V = atlas_model_vocab_size(m), d = (int)emb->shape[1];
    float *logits = malloc(sizeof(float) * N * V), *h = malloc(sizeof(float) * N * d);
    float *want = malloc(sizeof(float) * N * V);
    CHECK_OK(run(m, 0, logits));
    CHECK_OK(run(m, 1, h));
    const uint16_t *w = emb->data;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int k = 0; k < d; k++) s += (double)h[r * d + k] * atlas_bf16_to_f32(w[v * d + k]);
            want[r * V + v] = (float)s;
        }
    double e = harness_rel_err(logits, want, N * V);
    CHECK_MSG(e < 1e-5, "logits against hidden rows x the tied head: relative error %.3g", e);
    printf("qk-norm: %d hidden rows x the embedding table give the logits within %.2g\n", N, e);
    /* hidden rows with an argmax, or to no buffer: refused, named */
    int32_t ids[N];
    int32_t tokens[1] = {1}, pos[1] = {0}, rows[1] = {0}, start[2] = {0, 1}, ctx[1] = {1},
            table[1] = {0};
    atlas_batch b = {.n_tokens = 1, .tokens = tokens, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table, .max_blocks = 1,
                     .n_logits = 1, .logit_rows = rows, .hidden = 1};
    CHECK(atlas_model_forward_argmax(m, &b, ids) == ATLAS_ERR_INVALID);
    CHECK(atlas_model_forward_argmax_queue(m, &b) == ATLAS_ERR_UNSUPPORTED);
    free(logits);
    free(h);
    free(want);
    atlas_st_free(st);
    CHECK_OK(atlas_model_release(m));
}

static const char *const CONFIG =
    "{\"architectures\": [\"%s\"], \"hidden_size\": 32, \"intermediate_size\": 64, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
    "\"vocab_size\": 512, \"max_position_embeddings\": 64, \"num_hidden_layers\": 1%s}";

static const char *const MODULES =
    "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
    "\"sentence_transformers.models.Transformer\"}, "
    "{\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": "
    "\"sentence_transformers.models.Pooling\"}%s]";

/* A model directory's config files (no weights: atlas_config_load reads only these). */
static atlas_status config_of(const char *arch, const char *extra, const char *modules_extra,
                              const char *pooling, atlas_config *c) {
    char dir[512], text[2048];
    if (!harness_mkdtemp(dir, sizeof dir, "embed")) return ATLAS_ERR_IO;
    snprintf(text, sizeof text, CONFIG, arch, extra);
    ckpt_write_text(dir, "config.json", text);
    if (modules_extra) {
        snprintf(text, sizeof text, MODULES, modules_extra);
        ckpt_write_text(dir, "modules.json", text);
    }
    if (pooling) {
        char sub[600];
        snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
        CHECK(mkdir(sub, 0755) == 0);
        ckpt_write_text(sub, "config.json", pooling);
    }
    atlas_status st = atlas_config_load(dir, c);
    harness_rm_rf(dir);
    return st;
}

#define POOL(mode, more) "{\"word_embedding_dimension\": 32, \"pooling_mode_" mode "\": true" more "}"

/* A refusal whose message names what it refuses. */
static void refused(atlas_status st, atlas_status want, const char *needle) {
    CHECK_MSG(st == want && strstr(atlas_last_error(), needle), "want %s naming '%s', got %s: %s",
              atlas_status_str(want), needle, atlas_status_str(st), atlas_last_error());
}

static void test_layouts(void) {
    atlas_config c;
    const char *norm = ", {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": "
                       "\"sentence_transformers.models.Normalize\"}";
    CHECK_OK(config_of("Qwen3ForCausalLM", "", norm, POOL("lasttoken", ""), &c));
    CHECK(c.pooling == ATLAS_POOL_LAST && c.normalize && c.n_matryoshka == 0);
    CHECK_OK(config_of("Qwen3Model", ", \"is_matryoshka\": true, \"matryoshka_dimensions\": "
                       "[8, 16, 32]", "", POOL("mean_tokens", ", \"include_prompt\": true"), &c));
    CHECK(c.pooling == ATLAS_POOL_MEAN && !c.normalize && c.n_matryoshka == 3 &&
          c.matryoshka[1] == 16 && !c.matryoshka_any);
    CHECK_OK(config_of("LlamaForCausalLM", ", \"is_matryoshka\": true", "",
                       POOL("cls_token", ""), &c));
    CHECK(c.pooling == ATLAS_POOL_CLS && c.matryoshka_any);
    CHECK_OK(config_of("Qwen3ForCausalLM", "", NULL, NULL, &c)); /* a generative model */
    CHECK(c.pooling == ATLAS_POOL_NONE);
    refused(config_of("Qwen3ForCausalLM", "", "", POOL("max_tokens", ""), &c),
            ATLAS_ERR_UNSUPPORTED, "pooling_mode_max_tokens");
    refused(config_of("Qwen3ForCausalLM", "", "",
                      POOL("mean_tokens", ", \"pooling_mode_cls_token\": true"), &c),
            ATLAS_ERR_UNSUPPORTED, "2 pooling modes");
    refused(config_of("Qwen3ForCausalLM", "", "", POOL("lasttoken", ", \"include_prompt\": false"),
                      &c), ATLAS_ERR_UNSUPPORTED, "include_prompt");
    refused(config_of("Qwen3ForCausalLM", "", ", {\"path\": \"2_Dense\", \"type\": "
                      "\"sentence_transformers.models.Dense\"}", POOL("lasttoken", ""), &c),
            ATLAS_ERR_UNSUPPORTED, "sentence_transformers.models.Dense");
    refused(config_of("Qwen3ForCausalLM", "", "", NULL, &c), ATLAS_ERR_IO, "1_Pooling");
    refused(config_of("Qwen3Model", "", NULL, NULL, &c), ATLAS_ERR_UNSUPPORTED, "Qwen3Model");
    refused(config_of("Qwen3ForCausalLM", ", \"matryoshka_dimensions\": [64]", "",
                      POOL("lasttoken", ""), &c), ATLAS_ERR_FORMAT, "matryoshka_dimensions");
    refused(config_of("Qwen2ForCausalLM", ", \"is_causal\": false", "", POOL("lasttoken", ""),
                      &c), ATLAS_ERR_UNSUPPORTED, "\"is_causal\": false");
    refused(config_of("Qwen3ForCausalLM", ", \"use_bidirectional_attention\": true", NULL, NULL,
                      &c), ATLAS_ERR_UNSUPPORTED, "bidirectional attention");
    refused(config_of("Qwen2ForCausalLM", ", \"_name_or_path\": \"Alibaba-NLP/gte-Qwen2-7B-instruct\"",
                      "", POOL("lasttoken", ""), &c), ATLAS_ERR_UNSUPPORTED, "gte-Qwen2");
}

static void on_event(const atlas_event *ev, void *user) {
    (void)ev, (void)user;
}

/* The engine's side, before any load: what an embedding model is (embedding_info, the models
 * file's Matryoshka widths over config.json's) and which requests each kind of model takes. */
static void test_engine(void) {
    char emb[512], gen[1024];
    snprintf(gen, sizeof gen, "%s/small/qk-norm", harness_data_dir());
    if (!harness_mkdtemp(emb, sizeof emb, "embed-engine")) return;
    char text[2048], sub[600];
    snprintf(text, sizeof text, CONFIG, "Qwen3ForCausalLM", ", \"matryoshka_dimensions\": [8]");
    ckpt_write_text(emb, "config.json", text);
    snprintf(text, sizeof text, MODULES, "");
    ckpt_write_text(emb, "modules.json", text);
    snprintf(sub, sizeof sub, "%s/1_Pooling", emb);
    CHECK(mkdir(sub, 0755) == 0);
    ckpt_write_text(sub, "config.json", POOL("mean_tokens", ""));
    static const int widths[] = {16, 32};
    atlas_engine_model models[2] = {{.name = "emb", .dir = emb}, {.name = "gen", .dir = gen}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = models;
    p.n_models = 2;
    p.device = ATLAS_DEVICE_CPU;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    atlas_engine_embedding info;
    if (e) {
        CHECK_OK(atlas_engine_embedding_info(e, "emb", &info));
        CHECK(info.is_embedding && !strcmp(info.pooling, "mean") && !info.normalize &&
              info.dims == 32 && info.n_matryoshka == 1 && info.matryoshka[0] == 8);
        CHECK_OK(atlas_engine_embedding_info(e, "gen", &info));
        CHECK(!info.is_embedding && !info.pooling);
        int32_t ids[3] = {1, 2, 3};
        atlas_request r = {.model = "emb", .prompt = ids, .n_prompt = 3,
                           .sampling = atlas_sampler_default_params()};
        refused(atlas_engine_submit(e, &r, on_event, NULL, NULL), ATLAS_ERR_INVALID,
                "'emb' is an embedding model");
        r.model = "gen";
        r.embed = 1;
        refused(atlas_engine_submit(e, &r, on_event, NULL, NULL), ATLAS_ERR_INVALID,
                "'gen' is not an embedding model");
        atlas_engine_free(e);
        e = NULL;
    }
    models[0].matryoshka_dims = widths; /* the models file's widths replace config.json's */
    models[0].n_matryoshka_dims = 2;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (e) {
        CHECK_OK(atlas_engine_embedding_info(e, "emb", &info));
        CHECK(info.n_matryoshka == 2 && info.matryoshka[0] == 16 && info.matryoshka[1] == 32);
        atlas_engine_free(e);
        e = NULL;
    }
    static const int too_wide[] = {64};
    models[0].matryoshka_dims = too_wide;
    models[0].n_matryoshka_dims = 1;
    refused(atlas_engine_create(&p, &e), ATLAS_ERR_INVALID, "matryoshka dimension 64 outside 1..32");
    models[0].n_matryoshka_dims = 0;
    models[1].matryoshka_dims = widths;
    models[1].n_matryoshka_dims = 1;
    refused(atlas_engine_create(&p, &e), ATLAS_ERR_INVALID, "not an embedding model");
    atlas_engine_free(e);
    harness_rm_rf(emb);
}

int main(void) {
    test_hidden_rows();
    test_layouts();
    test_engine();
    return harness_finish();
}
