/* bench/cpu/cpu_decode.c — CPU decode speed of a ~100M-parameter random Llama, next to the
 * time of one memcpy of its weights measured in the same run (decode reads every weight
 * once per token, so that memcpy is the floor of a token's time at this memory bandwidth).
 *
 *   cpu_decode DIR [threads] [prompt_tokens] [decode_tokens]
 * writes DIR/config.json and DIR/model.safetensors (bf16, random) unless they exist, loads
 * them on the CPU backend, prefills prompt_tokens random ids, decodes decode_tokens greedily,
 * and prints one line of results. Build and run with bench/cpu/run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/model.h"
#include "core/dtype.h"
#include "core/file.h"
#include "model/forward.h"
#include "format/safetensors.h"

/* Llama geometry: 12 layers, d 768, 12 heads / 4 KV heads of 64, MLP 2048, vocab 32000,
 * tied embeddings: 100.1 M parameters. */
enum { D = 768, L = 12, H = 12, KVH = 4, HD = 64, F = 2048, V = 32000 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static double cpu_s(void) { /* CPU time of all threads: wall * threads when nothing else runs */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct spec {
    char name[96];
    int64_t rows, cols; /* cols 0: 1-D */
    float scale;        /* 0: a norm weight (values near 1) */
} spec;

static int specs(spec *s) {
    int n = 0;
    s[n++] = (spec){"model.embed_tokens.weight", V, D, 1.0f};
    s[n++] = (spec){"model.norm.weight", D, 0, 0};
    for (int l = 0; l < L; l++) {
#define S(nm, r, c, sc) (snprintf(s[n].name, sizeof s[n].name, "model.layers.%d." nm, l), \
                         s[n].rows = r, s[n].cols = c, s[n].scale = sc, n++)
        S("input_layernorm.weight", D, 0, 0);
        S("self_attn.q_proj.weight", H * HD, D, 1 / 27.7f);
        S("self_attn.k_proj.weight", KVH * HD, D, 1 / 27.7f);
        S("self_attn.v_proj.weight", KVH * HD, D, 1 / 27.7f);
        S("self_attn.o_proj.weight", D, H * HD, 1 / 27.7f);
        S("post_attention_layernorm.weight", D, 0, 0);
        S("mlp.gate_proj.weight", F, D, 1 / 27.7f);
        S("mlp.up_proj.weight", F, D, 1 / 27.7f);
        S("mlp.down_proj.weight", D, F, 1 / 45.3f);
#undef S
    }
    return n;
}

static int write_model(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return perror(path), 1;
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": %d, "
            "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
            " \"intermediate_size\": %d, \"vocab_size\": %d, \"max_position_embeddings\": 2048, "
            "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, "
            "\"torch_dtype\": \"bfloat16\", \"bos_token_id\": 1, \"eos_token_id\": 2}\n",
            D, L, H, KVH, F, V);
    fclose(f);
    static spec s[2 + 9 * L];
    int n = specs(s);
    size_t cap = 1 << 16, len = 0, off = 0;
    char *hdr = malloc(cap);
    len += snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)s[i].rows * (s[i].cols ? s[i].cols : 1) * 2;
        if (s[i].cols)
            len += snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],"
                            "\"data_offsets\":[%zu,%zu]}", i ? "," : "", s[i].name,
                            (long long)s[i].rows, (long long)s[i].cols, off, off + bytes);
        else
            len += snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],"
                            "\"data_offsets\":[%zu,%zu]}", i ? "," : "", s[i].name,
                            (long long)s[i].rows, off, off + bytes);
        off += bytes;
    }
    len += snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) return perror(path), 1;
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    free(hdr);
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)V * D);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)s[i].rows * (s[i].cols ? s[i].cols : 1);
        for (size_t j = 0; j < cnt; j++)
            buf[j] = atlas_f32_to_bf16(s[i].scale ? urand() * s[i].scale : 1.0f + 0.1f * urand());
        fwrite(buf, 2, cnt, f);
    }
    free(buf);
    if (fclose(f)) return perror(path), 1;
    return 0;
}

/* One sequence on blocks 0, 1, ...: feeds ids[from..to), argmax of the last into *next. */
static atlas_status step(atlas_model *m, const int32_t *ids, int from, int to, int32_t *table,
                         int max_blocks, int32_t *next) {
    int n = to - from;
    int32_t *pos = malloc(sizeof(int32_t) * n), start[2] = {0, n}, ctx = to, row = n - 1;
    for (int i = 0; i < n; i++) pos[i] = from + i;
    atlas_batch b = {.n_tokens = n, .tokens = ids + from, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = table,
                     .max_blocks = max_blocks, .n_logits = 1, .logit_rows = &row};
    atlas_status st = atlas_model_forward_argmax(m, &b, next);
    free(pos);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cpu_decode DIR [threads] [prompt_tokens] [decode_tokens]\n");
        return 2;
    }
    const char *dir = argv[1];
    int threads = argc > 2 ? atoi(argv[2]) : 0, n_prompt = argc > 3 ? atoi(argv[3]) : 64,
        n_decode = argc > 4 ? atoi(argv[4]) : 64;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!atlas_file_exists(path) && write_model(dir)) return 1;

    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = threads;
    p.load_tokenizer = 0;
    p.kv_tokens = n_prompt + n_decode + 16;
    atlas_model *m = NULL;
    double t0 = now_s();
    if (atlas_model_load(dir, &p, &m) != ATLAS_OK) {
        fprintf(stderr, "cpu_decode: %s\n", atlas_last_error());
        return 1;
    }
    double t_load = now_s() - t0;
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    int total = n_prompt + n_decode, max_blocks = atlas_model_kv_blocks(m);
    int32_t *ids = malloc(sizeof(int32_t) * (total + 1)), *table = malloc(sizeof(int32_t) * max_blocks);
    for (int i = 0; i < max_blocks; i++) table[i] = i;
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)((rng = rng * 6364136223846793005ull + 1) >> 40) % V;

    /* one warm-up pass faults the mapping in, so that decode measures compute, not disk */
    int32_t next;
    if (step(m, ids, 0, 1, table, max_blocks, &next) != ATLAS_OK) goto fail;
    t0 = now_s();
    if (step(m, ids, 0, n_prompt, table, max_blocks, &ids[n_prompt]) != ATLAS_OK) goto fail;
    double t_prefill = now_s() - t0;
    t0 = now_s();
    double c0 = cpu_s();
    for (int i = n_prompt; i < total - 1; i++)
        if (step(m, ids, i, i + 1, table, max_blocks, &ids[i + 1]) != ATLAS_OK) goto fail;
    double t_decode = now_s() - t0, c_decode = cpu_s() - c0;
    int decoded = total - 1 - n_prompt;

    /* one memcpy of all the weights, from the same mapping the forward reads */
    atlas_st *st = NULL;
    if (atlas_st_open_dir(dir, &st) != ATLAS_OK) goto fail;
    const atlas_tensor_view *first = atlas_st_at(st, 0);
    size_t bytes = atlas_st_total_bytes(st);
    const unsigned char *lo = first->data;
    for (size_t i = 0; i < atlas_st_count(st); i++)
        if ((const unsigned char *)atlas_st_at(st, i)->data < lo) lo = atlas_st_at(st, i)->data;
    unsigned char *dst = malloc(bytes);
    memset(dst, 1, bytes);                 /* fault the destination in first */
    memcpy(dst, lo, bytes);                /* and the source (page cache -> mapping) */
    double t_copy = 1e30; /* the best of three: the machine may be shared */
    for (int r = 0; r < 3; r++) {
        t0 = now_s();
        memcpy(dst, lo, bytes);
        double t = now_s() - t0;
        if (t < t_copy) t_copy = t;
    }
    volatile unsigned char sink = dst[bytes / 2];
    (void)sink;
    free(dst);
    atlas_st_free(st);

    double ms_tok = t_decode / decoded * 1e3;
    printf("model: %.1f M params, %s, %.1f MiB weights; load %.2f s; threads %d\n",
           info.n_params / 1e6, info.dtype, info.weight_bytes / 1048576.0, t_load, info.n_threads);
    printf("prefill: %d tokens in %.3f s = %.1f tok/s\n", n_prompt, t_prefill, n_prompt / t_prefill);
    printf("decode:  %d tokens in %.3f s = %.2f tok/s (%.1f ms/token); CPU time %.3f s = %.0f%% "
           "of %d threads (less: the machine is shared)\n", decoded, t_decode, decoded / t_decode,
           ms_tok, c_decode, 100 * c_decode / (t_decode * info.n_threads), info.n_threads);
    printf("memcpy of the weights (%.1f MiB, best of 3): %.1f ms = %.2f GB/s; decode token / memcpy = %.2fx\n",
           bytes / 1048576.0, t_copy * 1e3, bytes / t_copy / 1e9, ms_tok / (t_copy * 1e3));
    free(ids);
    free(table);
    return atlas_model_release(m) == ATLAS_OK ? 0 : 1;
fail:
    fprintf(stderr, "cpu_decode: %s\n", atlas_last_error());
    return 1;
}
