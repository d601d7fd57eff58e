/* tests/test-small-refs.c — the small-width conformance set at load (issue 23, part 7).
 *
 * The comparison itself is the ctest "small-refs" (tests/scripts.cmake): atlas-conform runs
 * every tests/data/small model through the engine on the CPU against transformers' reference.
 * This test checks what that one takes for granted and what users meet first:
 * - every small model loads on the CPU without a tokenizer (load_tokenizer = 0: the suite
 *   feeds token ids), with the geometry its config.json gives, binds every tensor of its
 *   checkpoint (the biases of llama-biases and qwen3-attn-bias included: a directory of
 *   tests/data/small is picked up here and by the ctests as soon as make.py has made it),
 *   and carries a reference with prompts longer than the ctest's 16-token step budget;
 * - RoPE types atlas does not compute (dynamic, Phi-3's older "su", anything unknown) are refused by atlas_model_load and by the engine, in the rope_scaling and the
 *   rope_parameters spellings, with the type and the file named — never run with plain RoPE;
 *   the same config with a type atlas computes loads (the refusal is the type's). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "harness.h"
#include "format/safetensors.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out)) ok = 0;
    CHECK_MSG(ok, "copying %s to %s", src, dst);
    return ok;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f)) ok = 0;
    CHECK_MSG(ok, "writing %s", path);
    return ok;
}

/* Elements of every tensor of DIR/model.safetensors; -1 when it cannot be opened. */
static long long checkpoint_elements(const char *dir) {
    char path[1400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    atlas_st *st = NULL;
    if (atlas_st_open_file(path, &st) != ATLAS_OK) return -1;
    long long total = 0;
    for (size_t i = 0; i < atlas_st_count(st); i++) {
        const atlas_tensor_view *v = atlas_st_at(st, i);
        long long n = 1;
        for (int d = 0; d < v->n_dims; d++) n *= v->shape[d];
        /* MXFP4 experts (gpt-oss): a byte of _blocks holds two weights, _scales none */
        size_t len = strlen(v->name);
        if (len > 7 && !strcmp(v->name + len - 7, "_blocks")) n *= 2;
        if (len > 7 && !strcmp(v->name + len - 7, "_scales")) n = 0;
        total += n;
    }
    atlas_st_free(st);
    return total;
}

/* The largest prompt length L of the reference's L<L>.prompt entries; 0 when there is none. */
static int longest_prompt(const char *dir) {
    char path[1400];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    atlas_st *st = NULL;
    if (atlas_st_open_file(path, &st) != ATLAS_OK) return 0;
    int best = 0;
    for (size_t i = 0; i < atlas_st_count(st); i++) {
        int len;
        char rest[16];
        if (sscanf(atlas_st_at(st, i)->name, "L%d.%15s", &len, rest) == 2 &&
            !strcmp(rest, "prompt") && len > best)
            best = len;
    }
    atlas_st_free(st);
    return best;
}

static int n_small;

static void test_loads(void) {
    const char *root = harness_data_path("small");
    char rootbuf[1024];
    snprintf(rootbuf, sizeof rootbuf, "%s", root);
    DIR *d = opendir(rootbuf);
    CHECK_MSG(d != NULL, "%s: no small-width models (tools/conformance/make.py --set small)",
              rootbuf);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[1300];
        snprintf(dir, sizeof dir, "%s/%s", rootbuf, e->d_name);
        if (!is_dir(dir)) continue;
        n_small++;
        atlas_model_params p = atlas_model_default_params();
        p.device = ATLAS_DEVICE_CPU;
        p.load_tokenizer = 0;
        p.n_threads = 2;
        atlas_model *m = NULL;
        CHECK_OK(atlas_model_load(dir, &p, &m));
        if (m) {
            atlas_model_info info;
            atlas_model_get_info(m, &info);
            CHECK_MSG(info.n_layers >= 2 && info.n_layers <= 8 && info.vocab_size <= 512 && info.hidden <= 96 &&
                          !strcmp(info.backend, "cpu") && atlas_model_tokenizer(m) == NULL,
                      "%s: %d layers, vocab %d, hidden %d, %s", dir, info.n_layers,
                      info.vocab_size, info.hidden, info.backend);
            long long elems = checkpoint_elements(dir);
            CHECK_MSG(info.n_params == elems, "%s: %lld parameters bound, the checkpoint holds "
                      "%lld", dir, (long long)info.n_params, elems);
            CHECK_OK(atlas_model_release(m));
        }
        int longest = longest_prompt(dir);
        CHECK_MSG(longest > 16, "%s: reference.safetensors: longest prompt %d (want > 16, the "
                  "step budget of the small-refs ctest)", dir, longest);
    }
    closedir(d);
    CHECK_MSG(n_small >= 9, "%d small models", n_small);
}

/* rope-linear's geometry and weights with the RoPE spec replaced. */
static const char *const CONFIG_FMT =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
    "\"hidden_size\": 32, \"intermediate_size\": 64, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"vocab_size\": 512, \"max_position_embeddings\": 1024, "
    "\"rms_norm_eps\": 1e-05, \"num_hidden_layers\": 2, \"tie_word_embeddings\": false, "
    "\"torch_dtype\": \"bfloat16\", \"rope_theta\": 10000.0, \"%s\": {\"%s\": \"%s\", "
    "\"factor\": 4.0, \"rope_theta\": 10000.0, \"original_max_position_embeddings\": 256, "
    "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
    "\"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], \"long_factor\": [2, 2, 2, 2, 2, 2, 2, 2]}}";

static void test_refusals(void) {
    char src[1024];
    snprintf(src, sizeof src, "%s", harness_data_path("small/rope-linear"));
    if (!is_dir(src)) {
        CHECK_MSG(0, "%s missing", src);
        return;
    }
    char dir[600], path[800], weights[1100];
    if (!harness_mkdtemp(dir, sizeof dir, "rope-refuse")) return;
    snprintf(weights, sizeof weights, "%s/model.safetensors", src);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!copy_file(weights, path)) goto done;
    snprintf(path, sizeof path, "%s/config.json", dir);

    static const char *const spellings[][2] = {{"rope_scaling", "type"},
                                               {"rope_scaling", "rope_type"},
                                               {"rope_parameters", "rope_type"}};
    static const char *const refused[] = {"dynamic", "longrope2", "su", "ntk-by-parts-v9"};
    static const char *const computed[] = {"linear", "yarn", "llama3"};
    char json[1024];
    for (int s = 0; s < 3; s++) {
        for (int t = 0; t < 4; t++) {
            snprintf(json, sizeof json, CONFIG_FMT, spellings[s][0], spellings[s][1], refused[t]);
            if (!write_text(path, json)) goto done;
            atlas_model_params p = atlas_model_default_params();
            p.device = ATLAS_DEVICE_CPU;
            p.load_tokenizer = 0;
            atlas_model *m = NULL;
            atlas_status st = atlas_model_load(dir, &p, &m);
            char want[128];
            snprintf(want, sizeof want, "\"%s\"", refused[t]);
            const char *msg = atlas_last_error();
            CHECK_MSG(st == ATLAS_ERR_UNSUPPORTED && !m && strstr(msg, want) &&
                          strstr(msg, "config.json") && strstr(msg, spellings[s][0]),
                      "%s.%s = %s: %s: %s", spellings[s][0], spellings[s][1], refused[t],
                      atlas_status_str(st), msg);
            if (m) atlas_model_release(m);

            /* the engine (atlas serve, atlas run) says the same */
            atlas_engine_model mod = {.name = "refused", .dir = dir};
            atlas_engine_params ep = atlas_engine_default_params();
            ep.models = &mod;
            ep.n_models = 1;
            ep.device = ATLAS_DEVICE_CPU;
            atlas_engine *e = NULL;
            st = atlas_engine_create(&ep, &e);
            if (st == ATLAS_OK) st = atlas_engine_load(e, "refused");
            msg = atlas_last_error();
            CHECK_MSG(st != ATLAS_OK && strstr(msg, want), "engine, %s.%s = %s: %s: %s",
                      spellings[s][0], spellings[s][1], refused[t], atlas_status_str(st), msg);
            atlas_engine_free(e);
        }
        /* the same file with a type atlas computes loads */
        for (int t = 0; t < 3; t++) {
            snprintf(json, sizeof json, CONFIG_FMT, spellings[s][0], spellings[s][1], computed[t]);
            if (!write_text(path, json)) goto done;
            atlas_model_params p = atlas_model_default_params();
            p.device = ATLAS_DEVICE_CPU;
            p.load_tokenizer = 0;
            atlas_model *m = NULL;
            CHECK_OK(atlas_model_load(dir, &p, &m));
            if (m) CHECK_OK(atlas_model_release(m));
        }
    }
done:
    harness_rm_rf(dir);
}

int main(void) {
    test_loads();
    test_refusals();
    printf("%d small models\n", n_small);
    return harness_finish();
}
