/* test-model.c — loading the fixture models, what atlas_model_get_info reports, the eos
 * set, counted handles (release refused with ATLAS_ERR_BUSY and the count while another
 * handle is live, nothing unloaded, then released), and errors that name what is wrong:
 * a missing directory, a tensor of the wrong shape, a missing tensor, bad batches, a broken
 * tokenizer.json or weights file (the tokenizer loads in a thread of its own); every
 * tensor of a checkpoint accounted for (bound, or one its architecture may ignore; a stray
 * one refused by name, on every tensor-parallel rank); where a load read from (disk, part
 * cached, page cache); `atlas info` and `atlas bench --batch` on the CPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atlas/model.h"
#include "atlas/tokenizer.h"
#include "ckpt.h"
#include "harness.h"
#include "model/forward.h"
#include "format/safetensors.h"

static int has_eos(const atlas_model *m, int32_t id) {
    const int32_t *ids;
    int n = atlas_model_eos(m, &ids);
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* One token at position 0 of a one-block sequence; returns the forward's status. */
static atlas_status forward_one(atlas_model *m, int32_t token, int32_t block, float *logits) {
    int32_t pos = 0, start[2] = {0, 1}, ctx = 1, row = 0;
    atlas_batch b = {.n_tokens = 1, .tokens = &token, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = &block,
                     .max_blocks = 1, .n_logits = 1, .logit_rows = &row};
    return atlas_model_forward(m, &b, logits);
}

static void test_info(const char *name, const char *arch, int32_t eos) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", harness_data_dir(), name);
    if (!harness_require_file(harness_data_path(strcat(strcpy((char[64]){0}, name), "/tokenizer.json"))))
        return;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, NULL, &m)); /* defaults: AUTO device, tokenizer */
    if (!m) return;
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    CHECK(!strcmp(info.architecture, arch));
    CHECK(!strcmp(info.backend, "cpu")); /* no GPU here: AUTO falls back */
    CHECK_MSG(strstr(info.backend_why, "CUDA") != NULL, "why: %s", info.backend_why);
    CHECK(!strcmp(info.dtype, "BF16") && info.tied_embeddings == 1);
    CHECK(info.kv_block_size == 16 && info.kv_blocks > 0 && info.n_threads >= 1);
    CHECK(info.kv_bytes == (size_t)2 * info.n_layers * info.kv_blocks * 16 * info.n_kv_heads *
                               info.head_dim * sizeof(float));
    /* every tensor of the (tied) checkpoint is used once */
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_dir(dir, &st));
    int64_t elems = 0;
    for (size_t i = 0; st && i < atlas_st_count(st); i++) {
        const atlas_tensor_view *v = atlas_st_at(st, i);
        int64_t n = 1;
        for (int d = 0; d < v->n_dims; d++) n *= v->shape[d];
        elems += n;
    }
    CHECK_MSG(info.n_params == elems, "%s: n_params %lld, tensors hold %lld", name,
              (long long)info.n_params, (long long)elems);
    CHECK(info.weight_bytes == atlas_st_total_bytes(st));
    atlas_st_free(st);
    CHECK(atlas_model_tokenizer(m) != NULL);
    CHECK_MSG(has_eos(m, eos), "%s: eos %d missing", name, eos);
    CHECK(atlas_model_is_eos(m, eos) && !atlas_model_is_eos(m, 5));
    CHECK(atlas_model_vocab_size(m) == info.vocab_size);
    /* the headers alone say what the load found */
    atlas_model_survey sv;
    CHECK_OK(atlas_model_inspect(dir, NULL, &sv));
    CHECK(!strcmp(sv.architecture, info.architecture) && !strcmp(sv.dtype, info.dtype));
    CHECK_MSG(sv.n_params == info.n_params && sv.weight_bytes == info.weight_bytes,
              "%s: inspect %lld params %zu bytes, load %lld %zu", name, (long long)sv.n_params,
              sv.weight_bytes, (long long)info.n_params, info.weight_bytes);
    CHECK(sv.n_layers == info.n_layers && sv.n_kv_heads == info.n_kv_heads &&
          sv.vocab_size == info.vocab_size && sv.tied_embeddings == info.tied_embeddings);
    CHECK(sv.kv_blocks == info.kv_blocks && sv.kv_bytes == info.kv_bytes);
    CHECK(!strcmp(sv.backend, info.backend) && sv.has_tokenizer == 1);
    CHECK(sv.needed_bytes == sv.weight_bytes + sv.kv_bytes && sv.fits == 1);
    CHECK_MSG(sv.available_bytes > sv.needed_bytes && strstr(sv.available_what, "MemAvailable"),
              "%zu: %s", sv.available_bytes, sv.available_what);
    CHECK_OK(atlas_model_release(m));
}

#if defined(__x86_64__)
/* Whether /proc/cpuinfo lists flag (x86's "flags" line): an oracle apart from the backend's
 * own CPUID probe. */
static int cpuinfo_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[8192];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5))
            for (char *t = strtok(line, " \t\n"); t && !found; t = strtok(NULL, " \t\n"))
                found = !strcmp(t, flag);
    fclose(f);
    return found;
}
#endif

/* The command line's default, AUTO: int8 (a bf16 KV cache) on a CPU with bf16 or integer dot
 * products (AVX2 in the release's x86-64 build; AVX512_BF16), fp32 on one without; the
 * kernels line and the KV bytes say which, and whether a bf16 weight's activations are
 * rounded (only for the bf16 dot products). */
static void test_auto_activations(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-llama3", harness_data_dir());
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.cpu_activations = ATLAS_CPU_ACT_AUTO;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return;
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    int int8 = info.kernels[0] != '\0';
    size_t elem = int8 ? 2 : sizeof(float);
    CHECK_MSG(info.kv_bytes == (size_t)2 * info.n_layers * info.kv_blocks * info.kv_block_size *
                                   info.n_kv_heads * info.head_dim * elem,
              "kernels '%s', kv_bytes %zu", info.kernels, info.kv_bytes);
#if defined(__x86_64__)
    int bf16 = cpuinfo_has("avx512_bf16");
#if defined(__AVX2__) && defined(__FMA__)
    int avx2 = cpuinfo_has("avx2"); /* the build's vector kernels, vpmaddubsw among them */
#else
    int avx2 = 0;
#endif
    CHECK_MSG(int8 == (bf16 || avx2), "avx512_bf16 %d, avx2 %d, kernels '%s'", bf16, avx2,
              info.kernels);
    if (int8) CHECK_MSG(strstr(info.kernels, "int8") && strstr(info.kernels, "KV cache bf16"),
                        "kernels '%s'", info.kernels);
    if (bf16) CHECK_MSG(strstr(info.kernels, "AVX512_BF16"), "kernels '%s'", info.kernels);
    if (int8 && !bf16) CHECK_MSG(strstr(info.kernels, "fp32 activations"), "kernels '%s'",
                                 info.kernels);
#endif
    CHECK_OK(atlas_model_release(m));
}

/* A load whose KV cache cannot fit is refused before it reads a weight, naming both figures;
 * no_memory_check goes on past the check. */
static void test_memory_check(void) {
    const char *dir = harness_data_path("tiny-llama3");
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.kv_blocks = INT32_MAX; /* petabytes of KV cache */
    atlas_model_survey sv;
    CHECK_OK(atlas_model_inspect(dir, &p, &sv));
    CHECK(sv.fits == 0 && sv.needed_bytes > sv.available_bytes && sv.available_bytes > 0);
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load(dir, &p, &m);
    CHECK_MSG(st == ATLAS_ERR_NOMEM && !m && strstr(atlas_last_error(), "not enough memory") &&
                  strstr(atlas_last_error(), "GiB is available") &&
                  strstr(atlas_last_error(), "nothing was read"),
              "%s: %s", atlas_status_str(st), atlas_last_error());
    p.no_memory_check = 1;
    st = atlas_model_load(dir, &p, &m);
    CHECK_MSG(!strstr(atlas_last_error(), "not enough memory"), "%s", atlas_last_error());
    if (st == ATLAS_OK) CHECK_OK(atlas_model_release(m)); /* overcommit mapped it, untouched */
    /* a directory without weights: the loader's error, from the headers alone */
    CHECK(atlas_model_inspect(harness_data_path("."), NULL, &sv) != ATLAS_OK);
}

static void test_handles(void) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.n_threads = 2;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(harness_data_path("tiny-qwen3"), &p, &m));
    if (!m) return;
    CHECK(atlas_model_tokenizer(m) == NULL);
    CHECK(atlas_model_handles(m) == 1);
    atlas_model *a = atlas_model_ref(m), *b = atlas_model_ref(m);
    CHECK(a == m && b == m && atlas_model_handles(m) == 3);
    CHECK(atlas_model_release(m) == ATLAS_ERR_BUSY);
    CHECK_MSG(strstr(atlas_last_error(), "2 other handle") != NULL, "%s", atlas_last_error());
    atlas_model_unref(b);
    CHECK(atlas_model_release(m) == ATLAS_ERR_BUSY);
    CHECK_MSG(strstr(atlas_last_error(), "1 other handle") != NULL, "%s", atlas_last_error());
    /* nothing was unloaded: the model still runs, and gives the same logits as before */
    int V = atlas_model_vocab_size(m);
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    CHECK_OK(forward_one(m, 9707, 0, l1));
    CHECK_OK(forward_one(m, 9707, 1, l2));
    CHECK(memcmp(l1, l2, sizeof(float) * V) == 0);
    free(l1);
    free(l2);
    CHECK(atlas_model_handles(a) == 2);
    atlas_model_unref(a);
    CHECK(atlas_model_handles(m) == 1);
    CHECK_OK(atlas_model_release(m));
    CHECK_OK(atlas_model_release(NULL));
    atlas_model_unref(NULL);
}

/* A checkpoint whose header length is odd (safetensors allows trailing spaces in the header)
 * puts every tensor at an odd address in the mapping: the CPU backend must give the same
 * logits as from the original file (and, under UBSan, read nothing misaligned). */
static void test_unaligned(void) {
    char dir[600], src[600], dst[700], cfg_src[600], cfg_dst[700];
    if (!harness_mkdtemp(dir, sizeof dir, "unaligned")) return;
    snprintf(src, sizeof src, "%s", harness_data_path("tiny-llama3/model.safetensors"));
    snprintf(cfg_src, sizeof cfg_src, "%s", harness_data_path("tiny-llama3/config.json"));
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    snprintf(cfg_dst, sizeof cfg_dst, "%s/config.json", dir);
    FILE *f = fopen(src, "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *raw = malloc(len + 1);
    CHECK(fread(raw, 1, len, f) == len);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
    CHECK(hl % 2 == 0); /* so that one more byte makes it odd */
    uint64_t hl2 = hl + 1;
    for (int i = 0; i < 8; i++) raw[i] = (unsigned char)(hl2 >> (8 * i));
    f = fopen(dst, "wb");
    CHECK(f && fwrite(raw, 1, 8 + hl, f) == 8 + hl && fputc(' ', f) == ' ' &&
          fwrite(raw + 8 + hl, 1, len - 8 - hl, f) == len - 8 - hl);
    if (f) fclose(f);
    char *cfg = NULL;
    size_t cfg_len = 0;
    f = fopen(cfg_src, "rb");
    if (f) {
        cfg = malloc(1 << 16);
        cfg_len = fread(cfg, 1, 1 << 16, f);
        fclose(f);
        f = fopen(cfg_dst, "wb");
        if (f) fwrite(cfg, 1, cfg_len, f), fclose(f);
    }
    free(cfg);
    free(raw);

    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    atlas_model *a = NULL, *b = NULL;
    CHECK_OK(atlas_model_load(harness_data_path("tiny-llama3"), &p, &a));
    CHECK_OK(atlas_model_load(dir, &p, &b));
    if (a && b) {
        int V = atlas_model_vocab_size(a);
        float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
        CHECK_OK(forward_one(a, 1234, 0, la));
        CHECK_OK(forward_one(b, 1234, 0, lb));
        CHECK_MSG(memcmp(la, lb, sizeof(float) * V) == 0,
                  "logits from the unaligned copy differ");
        free(la);
        free(lb);
    }
    CHECK_OK(atlas_model_release(a));
    CHECK_OK(atlas_model_release(b));
    harness_rm_rf(dir);
}

/* Copies the first `keep` bytes (all when keep < 0) of tiny-llama3/NAME into DIR/NAME. */
static int copy_fixture(const char *dir, const char *name, long keep) {
    char src[600], dst[700], buf[1 << 16];
    snprintf(src, sizeof src, "%s/tiny-llama3/%s", harness_data_dir(), name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int ok = in && out;
    size_t n, left = keep < 0 ? (size_t)-1 : (size_t)keep;
    while (ok && left && (n = fread(buf, 1, left < sizeof buf ? left : sizeof buf, in)) > 0) {
        ok = fwrite(buf, 1, n, out) == n;
        left -= n;
    }
    if (in) fclose(in);
    if (out) fclose(out);
    CHECK_MSG(ok, "copying %s to %s", src, dst);
    return ok;
}

/* The tokenizer loads in a thread while the weights load: its failure reaches the caller
 * with its message, and a weights failure while it runs frees the tokenizer (ASan checks
 * the leak); when both fail, the tokenizer's error is the one reported. */
static void test_broken_files(void) {
    if (!harness_require_file(harness_data_path("tiny-llama3/tokenizer.json"))) return;
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    atlas_model *m = NULL;
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "broken-tok")) return;
    copy_fixture(dir, "config.json", -1);
    copy_fixture(dir, "tokenizer_config.json", -1);
    copy_fixture(dir, "model.safetensors", -1);
    copy_fixture(dir, "tokenizer.json", 4000); /* cut inside the vocab */
    CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_FORMAT && !m);
    CHECK_MSG(strstr(atlas_last_error(), "tokenizer.json") != NULL &&
              strstr(atlas_last_error(), dir) != NULL, "%s", atlas_last_error());
    copy_fixture(dir, "model.safetensors", 100000); /* and the weights too */
    CHECK(atlas_model_load(dir, &p, &m) != ATLAS_OK && !m);
    CHECK_MSG(strstr(atlas_last_error(), "tokenizer.json") != NULL, "%s", atlas_last_error());
    copy_fixture(dir, "tokenizer.json", -1); /* only the weights broken */
    char want[700];
    snprintf(want, sizeof want, "%s/model.safetensors", dir);
    CHECK(atlas_model_load(dir, &p, &m) != ATLAS_OK && !m);
    CHECK_MSG(strstr(atlas_last_error(), want) != NULL &&
              !strstr(atlas_last_error(), "tokenizer"), "%s", atlas_last_error());
    copy_fixture(dir, "model.safetensors", -1); /* all good again: tokenizer and eos set */
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (m) {
        CHECK(atlas_model_tokenizer(m) != NULL && has_eos(m, 128001));
        CHECK_OK(atlas_model_release(m));
    }
    harness_rm_rf(dir);
}

static void test_bad_batches(void) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.kv_blocks = 4;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(harness_data_path("tiny-llama3"), &p, &m));
    if (!m) return;
    CHECK(atlas_model_kv_blocks(m) == 4 && atlas_model_kv_block_size(m) == 16);
    float *logits = malloc(sizeof(float) * atlas_model_vocab_size(m));
    CHECK(forward_one(m, 128256, 0, logits) == ATLAS_ERR_RANGE);
    CHECK_MSG(strstr(atlas_last_error(), "tokens[0] = 128256") != NULL, "%s", atlas_last_error());
    CHECK(forward_one(m, -1, 0, logits) == ATLAS_ERR_RANGE);
    CHECK(forward_one(m, 1, 4, logits) == ATLAS_ERR_RANGE);
    CHECK_MSG(strstr(atlas_last_error(), "block_table[0][0] = 4") != NULL, "%s",
              atlas_last_error());
    CHECK_OK(forward_one(m, 1, 3, logits));
    free(logits);
    CHECK_OK(atlas_model_release(m));
}

/* Writes DIR/model.safetensors holding the given tensors (bf16 zeros); a shape [r, 0] is
 * 1-D [r]. */
static void write_st(const char *dir, int n, const char *const *names, const int64_t (*shapes)[2]) {
    char header[8192] = "{", path[600];
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t r = shapes[i][0], c = shapes[i][1];
        size_t bytes = (size_t)r * (c ? c : 1) * 2;
        char shape[64];
        if (c) snprintf(shape, sizeof shape, "%lld,%lld", (long long)r, (long long)c);
        else snprintf(shape, sizeof shape, "%lld", (long long)r);
        snprintf(header + strlen(header), sizeof header - strlen(header),
                 "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                 i ? "," : "", names[i], shape, off, off + bytes);
        off += bytes;
    }
    strcat(header, "}");
    while (strlen(header) % 8) strcat(header, " ");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint64_t len = strlen(header);
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, len, f);
    char *zeros = calloc(1, off ? off : 1);
    fwrite(zeros, 1, off, f);
    free(zeros);
    fclose(f);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void remove_dir(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* A Qwen2 checkpoint binds q/k/v biases and, untied, lm_head.weight; a missing bias is an
 * error that names it. */
static void test_qwen2_binding(void) {
    char dir[] = "/tmp/atlas-test-qwen2-XXXXXX";
    if (!mkdtemp(dir)) return;
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 8, "
               "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
               "\"intermediate_size\": 16, \"vocab_size\": 32, \"tie_word_embeddings\": false, "
               "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 64}");
    const char *names[] = {
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias", "model.layers.0.self_attn.q_proj.bias"};
    const int64_t shapes[][2] = {{32, 8}, {8, 0}, {32, 8}, {8, 0}, {8, 8}, {4, 8}, {4, 8},
                                 {8, 8}, {8, 0}, {16, 8}, {16, 8}, {8, 16}, {4, 0}, {4, 0},
                                 {8, 0}};
    int n = (int)(sizeof names / sizeof names[0]);
    int64_t elems = 0;
    for (int i = 0; i < n; i++) elems += shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1);
    write_st(dir, n, names, shapes);
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (m) {
        atlas_model_info info;
        atlas_model_get_info(m, &info);
        CHECK(!strcmp(info.architecture, "Qwen2ForCausalLM") && !info.tied_embeddings);
        CHECK_MSG(info.n_params == elems, "n_params %lld, want %lld", (long long)info.n_params,
                  (long long)elems);
        float logits[32];
        CHECK_OK(forward_one(m, 31, 0, logits));
        CHECK(logits[0] == 0.0f && logits[31] == 0.0f); /* zero weights */
        CHECK_OK(atlas_model_release(m));
    }
    write_st(dir, n - 1, names, shapes); /* without q_proj.bias */
    CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_NOT_FOUND && !m);
    CHECK_MSG(strstr(atlas_last_error(), "model.layers.0.self_attn.q_proj.bias") != NULL, "%s",
              atlas_last_error());
    write_st(dir, 2, names, shapes); /* untied: lm_head.weight is required */
    CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_NOT_FOUND && !m);
    CHECK_MSG(strstr(atlas_last_error(), "lm_head.weight") != NULL, "%s", atlas_last_error());
    remove_dir(dir);
}

static void test_bad_checkpoints(void) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    atlas_model *m = NULL;
    CHECK(atlas_model_load("/nonexistent/model", &p, &m) == ATLAS_ERR_IO && !m);
    CHECK_MSG(strstr(atlas_last_error(), "/nonexistent/model") != NULL, "%s", atlas_last_error());

    char dir[] = "/tmp/atlas-test-model-XXXXXX", cfg[600], src[600];
    if (!mkdtemp(dir)) return;
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(src, sizeof src, "%s", harness_data_path("tiny-llama3/config.json"));
    FILE *in = fopen(src, "rb"), *out = fopen(cfg, "wb");
    char buf[4096];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);

    const char *names[2] = {"model.embed_tokens.weight", "model.norm.weight"};
    const int64_t bad_shape[1][2] = {{10, 16}};
    write_st(dir, 1, names, bad_shape);
    CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_FORMAT && !m);
    CHECK_MSG(strstr(atlas_last_error(), "model.embed_tokens.weight: shape [10, 16], want "
                                         "[128256, 16]") != NULL, "%s", atlas_last_error());
    const int64_t good_embed[1][2] = {{128256, 16}};
    write_st(dir, 1, names, good_embed);
    CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_NOT_FOUND && !m);
    CHECK_MSG(strstr(atlas_last_error(), "model.norm.weight: missing") != NULL, "%s",
              atlas_last_error());

    atlas_model_params bad = p;
    bad.kv_block_size = 0;
    CHECK(atlas_model_load(harness_data_path("tiny-llama3"), &bad, &m) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "kv_block_size") != NULL);
    bad = p;
    bad.device = ATLAS_DEVICE_CUDA; /* asked for explicitly: no fallback */
    CHECK(atlas_model_load(harness_data_path("tiny-llama3"), &bad, &m) != ATLAS_OK && !m);

    remove_dir(dir);
}

/* `atlas info` prints what the API reports; a bad directory is one line on stderr, exit 1. */
static void test_cli_info(void) {
    const char *bin = getenv("ATLAS_BIN");
    CHECK_MSG(bin != NULL, "ATLAS_BIN is not set");
    if (!bin) return;
    char cmd[1024], out[4096] = "";
    snprintf(cmd, sizeof cmd, "'%s' info -m '%s' 2>&1", bin, harness_data_path("tiny-qwen3"));
    int rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "%s: status %d", cmd, rc);
    CHECK_MSG(strstr(out, "architecture:  Qwen3ForCausalLM") && strstr(out, "parameters:    2443408") &&
              strstr(out, "heads:         4 query, 2 key/value (head_dim 16)") &&
              strstr(out, "weights:       BF16") && strstr(out, "backend:       cpu (CUDA") &&
              strstr(out, "formats:       embedding BF16 ") && !strstr(out, "quantization:") &&
              strstr(out, "a token reads: ") && strstr(out, "KiB per token of context (KV)"),
              "atlas info printed:\n%s", out);
    snprintf(cmd, sizeof cmd, "'%s' info -m /nonexistent/dir 2>&1", bin);
    rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc > 0 && strstr(out, "/nonexistent/dir") &&
                  strchr(out, '\n') == out + strlen(out) - 1,
              "status %d, output: %s", rc, out);
}

/* `atlas bench --batch`: one line a batch size after the single-sequence decode, on the CPU;
 * a batch of 0 is a usage error. */
static void test_cli_bench(void) {
    const char *bin = getenv("ATLAS_BIN");
    if (!bin) return; /* test_cli_info reports it */
    char cmd[1024], out[8192] = "";
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' --device cpu -p 16 -n 8 --batch 1,4 2>&1", bin,
             harness_data_path("tiny-llama3"));
    int rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 0, "%s: status %d:\n%s", cmd, rc, out);
    const char *b1 = strstr(out, "decode b1     4 steps of 1 sequences after 20 tokens: "),
               *b4 = strstr(out, "decode b4     4 steps of 4 sequences after 20 tokens: ");
    CHECK_MSG(b1 && b4 && b1 < b4 && strstr(out, "decode      4 steps after 20 tokens") < b1,
              "atlas bench printed:\n%s", out);
    /* each line's step times are ordered and hold the mean; the CPU captures no graph */
    double ms = 0, quick = 0, med = 0, slow = 0;
    unsigned long long cap = 1, rep = 1;
    int got = b1 ? sscanf(b1, "decode b1     4 steps of 1 sequences after 20 tokens: %lf ms/step, "
                          "%*f tok/s (steps %lf / %lf / %lf ms quickest / median / slowest; "
                          "graphs: %llu captured, %llu replayed)", &ms, &quick, &med, &slow,
                          &cap, &rep) : 0;
    CHECK_MSG(got == 6 && quick > 0 && quick <= med && med <= slow && quick <= ms &&
              cap == 0 && rep == 0, "b1 line (%d fields): %.80s", got, b1 ? b1 : "");
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' --device cpu --batch 2,0 2>&1", bin,
             harness_data_path("tiny-llama3"));
    rc = harness_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 2 && strstr(out, "--batch B"), "status %d: %s", rc, out);
}

/* ---- every tensor accounted for ------------------------------------------------------------ */

static float small_value(void *user, const char *name, int64_t i) {
    (void)user, (void)name;
    return (float)((i * 7) % 13 - 6) / 64.0f;
}

/* A Llama-family config of 2 layers, 4 heads (2 KV) of 4, with the given architecture and
 * extra fields ("" for none). */
static const char *small_config(const char *arch, const char *extra) {
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"%s\"], \"hidden_size\": 16, \"intermediate_size\": 32, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 4, "
             "\"num_hidden_layers\": 2, \"vocab_size\": 32, \"max_position_embeddings\": 64, "
             "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0%s%s}", arch, *extra ? ", " : "",
             extra);
    return buf;
}

/* Writes config.json and the tensors the config calls for (less drop, plus extra), then
 * loads as rank `rank` of `tp` (1: the whole model). The status; *n_params of the load. */
static atlas_status load_variant(const char *dir, const char *config, const char *drop,
                                 const ckpt_extra *extra, int n_extra, int rank, int tp,
                                 int64_t *n_params) {
    atlas_config c;
    CHECK_OK(atlas_config_parse(config, strlen(config), "variant", &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    if (!ckpt_write_text(dir, "config.json", config) ||
        !ckpt_write_model(dir, &g, drop, extra, n_extra, small_value, NULL))
        return ATLAS_ERR_IO;
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.n_threads = 1;
    p.tp_rank = rank;
    p.tp_size = tp;
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load(dir, &p, &m);
    if (m) {
        atlas_model_info info;
        atlas_model_get_info(m, &info);
        if (n_params) *n_params = info.n_params;
        CHECK_OK(atlas_model_release(m));
    }
    return st;
}

/* Refused, ATLAS_ERR_UNSUPPORTED, the message naming the file and tensor `first` (and
 * `more`, e.g. "(and 1 more)", when given). */
static void check_stray(const char *dir, const char *what, atlas_status st, const char *first,
                        const char *more) {
    const char *msg = atlas_last_error();
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    CHECK_MSG(st == ATLAS_ERR_UNSUPPORTED && strstr(msg, file) && strstr(msg, first) &&
                  (!more || strstr(msg, more)),
              "%s: %s: %s", what, atlas_status_str(st), msg);
}

/* Pages of the file [off, off + len) in the page cache, counted one by one. */
static size_t resident_pages(int fd, size_t off, size_t len) {
    void *p = mmap(NULL, off + len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return 0;
    size_t pages = (off + len + 4095) / 4096, in = 0;
    unsigned char *v = malloc(pages);
    if (v && mincore(p, off + len, v) == 0)
        for (size_t i = off / 4096; i < pages; i++) in += v[i] & 1;
    free(v);
    munmap(p, off + len);
    return in;
}

/* Where a load read from (atlas_model_info.load_source, from mincore on a page each 2 MiB),
 * on a checkpoint of its own of 32 MiB (larger than a disk's read-ahead, which the header's
 * read may bring in around it: 8 MiB on the CI machines): the weights' file dropped from
 * the page cache is "disk" with less than half cached; its second half dropped, "disk" with
 * part cached; after a load read it, "page_cache" with all of it. Skipped where the file
 * system keeps its pages (tmpfs: posix_fadvise drops nothing). */
static void test_load_source(void) {
    char dir[600], path[700];
    if (!harness_mkdtemp(dir, sizeof dir, "load-source")) return;
    const char *config =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 128, "
        "\"intermediate_size\": 256, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"head_dim\": 32, \"num_hidden_layers\": 2, \"vocab_size\": 131072, "
        "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, "
        "\"tie_word_embeddings\": true}";
    atlas_config c;
    CHECK_OK(atlas_config_parse(config, strlen(config), "load-source", &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = -1;
    if (ckpt_write_text(dir, "config.json", config) &&
        ckpt_write_model(dir, &g, NULL, NULL, 0, small_value, NULL))
        fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    if (fd < 0) {
        harness_rm_rf(dir);
        return;
    }
    (void)fsync(fd); /* written pages are dropped only once they are clean */
    struct stat st;
    fstat(fd, &st);
    size_t n = (size_t)st.st_size, half = n / 2 / 4096 * 4096;
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    for (int k = 0; k < 3; k++) {
        if (k < 2) { /* k 0: all of it dropped; 1: its second half */
            (void)posix_fadvise(fd, k ? (off_t)half : 0, 0, POSIX_FADV_DONTNEED);
            /* a few pages may stay (one the last read still held): not a 64th of them */
            if (resident_pages(fd, half, n - half) > (n - half) / 4096 / 64) {
                printf("load source: the page cache keeps %s's pages here; skipped\n", path);
                break;
            }
        }
        atlas_model *m = NULL;
        CHECK_OK(atlas_model_load(dir, &p, &m));
        if (!m) break;
        atlas_model_info info;
        atlas_model_get_info(m, &info);
        const char *want = k < 2 ? "disk" : "page_cache";
        size_t in = info.load_cached_bytes, all = info.weight_bytes;
        CHECK_MSG(!strcmp(info.load_source, want) &&
                      (k == 0 ? in < all / 2 : k == 1 ? in > 0 && in < all : in == all),
                  "load %d: from %s (want %s), %zu of %zu bytes cached", k, info.load_source,
                  want, in, all);
        CHECK_OK(atlas_model_release(m));
    }
    close(fd);
    harness_rm_rf(dir);
}

/* A tensor the architecture and config do not call for is refused, on any rank. */
static void test_strays(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "strays")) return;
    char llama_cfg[1024];
    snprintf(llama_cfg, sizeof llama_cfg, "%s",
             small_config("LlamaForCausalLM", "\"tie_word_embeddings\": false"));
    CHECK_OK(load_variant(dir, llama_cfg, NULL, NULL, 0, 0, 1, NULL));

    /* a bias the config does not call for: on the whole model and on either rank of two
     * (rank 1 holds no o_proj bias, nor lm_head, and still checks them) */
    const ckpt_extra o_bias = {"model.layers.1.self_attn.o_proj.bias", 16, 0};
    static const int ranks[][2] = {{0, 1}, {0, 2}, {1, 2}}; /* rank, tp_size */
    for (int i = 0; i < 3; i++) {
        atlas_status st = load_variant(dir, llama_cfg, NULL, &o_bias, 1, ranks[i][0],
                                       ranks[i][1], NULL);
        check_stray(dir, "llama, no attention_bias, an o_proj bias", st, o_bias.name, NULL);
    }
    const ckpt_extra two[] = {{"model.layers.0.mlp.down_proj.bias", 16, 0},
                              {"model.layers.0.mlp.experts.0.w1.weight", 32, 16}};
    atlas_status st = load_variant(dir, llama_cfg, NULL, two, 2, 1, 2, NULL);
    check_stray(dir, "llama, no mlp_bias, rank 1 of 2", st, "model.layers.0.mlp.down_proj.bias",
                "(and 1 more)");
    /* the untied lm_head is rank 0's only: rank 1 loads without it, nothing stray */
    CHECK_OK(load_variant(dir, llama_cfg, NULL, NULL, 0, 1, 2, NULL));

    /* the families' biases: Qwen3 has no MLP bias, Mistral none at all, Qwen2 no o bias */
    const ckpt_extra gate = {"model.layers.0.mlp.gate_proj.bias", 32, 0};
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s", small_config("Qwen3ForCausalLM",
                                                 "\"attention_bias\": true, \"mlp_bias\": true"));
    st = load_variant(dir, cfg, NULL, &gate, 1, 0, 1, NULL);
    check_stray(dir, "qwen3 with mlp_bias", st, gate.name, NULL);
    snprintf(cfg, sizeof cfg, "%s", small_config("MistralForCausalLM", "\"attention_bias\": true"));
    const ckpt_extra q_bias = {"model.layers.0.self_attn.q_proj.bias", 16, 0};
    st = load_variant(dir, cfg, NULL, &q_bias, 1, 0, 1, NULL);
    check_stray(dir, "mistral with a q_proj bias", st, q_bias.name, NULL);
    snprintf(cfg, sizeof cfg, "%s", small_config("Qwen2ForCausalLM", ""));
    st = load_variant(dir, cfg, NULL, &o_bias, 1, 0, 1, NULL);
    check_stray(dir, "qwen2 with an o_proj bias", st, o_bias.name, NULL);
    harness_rm_rf(dir);
}

/* The ignore table's tensors load (and are not bound); a bias the config calls for and the
 * checkpoint lacks is missing, named. */
static void test_ignored(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "ignored")) return;
    char llama_cfg[1024];
    snprintf(llama_cfg, sizeof llama_cfg, "%s",
             small_config("LlamaForCausalLM", "\"tie_word_embeddings\": false"));
    int64_t base = 0, n = 0;
    CHECK_OK(load_variant(dir, llama_cfg, NULL, NULL, 0, 0, 1, &base));
    /* RoPE tables an older transformers saved; lm_head.weight beside tied embeddings (not
     * bound: n_params as without it) */
    const ckpt_extra rope[] = {{"model.layers.0.self_attn.rotary_emb.inv_freq", 2, 0},
                               {"model.layers.1.self_attn.rotary_emb.inv_freq", 2, 0},
                               {"model.rotary_emb.inv_freq", 2, 0}};
    CHECK_OK(load_variant(dir, llama_cfg, NULL, rope, 3, 0, 1, &n));
    CHECK_MSG(n == base, "n_params %lld with the RoPE tables, %lld without", (long long)n,
              (long long)base);
    char tied[1024];
    snprintf(tied, sizeof tied, "%s", small_config("Qwen3ForCausalLM",
                                                   "\"tie_word_embeddings\": true"));
    CHECK_OK(load_variant(dir, tied, NULL, NULL, 0, 0, 1, &base));
    const ckpt_extra head = {"lm_head.weight", 32, 16};
    CHECK_OK(load_variant(dir, tied, NULL, &head, 1, 0, 1, &n));
    CHECK_MSG(n == base, "tied: n_params %lld with lm_head.weight, %lld without", (long long)n,
              (long long)base);
    CHECK_OK(load_variant(dir, tied, NULL, &head, 1, 1, 2, NULL));
    /* the tied-only pattern covers nothing else */
    const ckpt_extra o_bias = {"model.layers.1.self_attn.o_proj.bias", 16, 0};
    atlas_status st = load_variant(dir, tied, NULL, &o_bias, 1, 0, 1, NULL);
    check_stray(dir, "qwen3, no attention_bias, an o_proj bias", st, o_bias.name, NULL);

    /* a bias the config calls for and the checkpoint lacks is missing, named */
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s", small_config("LlamaForCausalLM",
                                                 "\"attention_bias\": true, \"mlp_bias\": true"));
    CHECK_OK(load_variant(dir, cfg, NULL, NULL, 0, 0, 1, &n));
    static const char *const biases[] = {"model.layers.1.self_attn.o_proj.bias",
                                         "model.layers.0.mlp.up_proj.bias",
                                         "model.layers.1.mlp.down_proj.bias"};
    for (int i = 0; i < 3; i++) {
        st = load_variant(dir, cfg, biases[i], NULL, 0, 1, 2, NULL);
        CHECK_MSG(st == ATLAS_ERR_NOT_FOUND && strstr(atlas_last_error(), biases[i]),
                  "without %s: %s: %s", biases[i], atlas_status_str(st), atlas_last_error());
    }
    harness_rm_rf(dir);
}

int main(void) {
    test_info("tiny-llama3", "LlamaForCausalLM", 128001);
    test_info("tiny-qwen3", "Qwen3ForCausalLM", 151645);
    test_auto_activations();
    test_memory_check();
    test_load_source();
    test_handles();
    test_unaligned();
    test_bad_batches();
    test_bad_checkpoints();
    test_broken_files();
    test_qwen2_binding();
    test_strays();
    test_ignored();
    test_cli_info();
    test_cli_bench();
    return harness_finish();
}
