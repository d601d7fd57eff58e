/* tests/test-default-model.c — the embedded default model (models/default): it loads, its
 * tokenizer gives the ids transformers gave, its greedy continuation of each reference
 * prompt is what transformers computed from the same checkpoint (models/default/
 * reference.json, made by tools/train_default.py), up to the first step whose margin is
 * too small to call, and the text it writes is mostly dictionary words. */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "atlas/tokenizer.h"
#include "core/file.h"
#include "harness.h"
#include "model/forward.h"

enum { MAX_CTX = 256 };

static char model_dir[4096];

/* Greedy decoding of one sequence: prefill the prompt, then one token a step. Fills out[n]
 * and the last-prompt-position logits. */
static atlas_status greedy(atlas_model *m, const int32_t *prompt, int n_prompt, int n_new,
                           int32_t *out, float *first_logits) {
    int vocab = atlas_model_vocab_size(m);
    int bs = atlas_model_kv_block_size(m);
    int max_blocks = MAX_CTX / bs + 1;
    int32_t table[MAX_CTX];
    for (int i = 0; i < max_blocks; i++) table[i] = i;
    int32_t tokens[MAX_CTX], pos[MAX_CTX];
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    if (!logits) return ATLAS_ERR_NOMEM;
    int ctx = 0, n_in = n_prompt;
    memcpy(tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    atlas_status st = ATLAS_OK;
    for (int step = 0; step < n_new && st == ATLAS_OK; step++) {
        for (int i = 0; i < n_in; i++) pos[i] = ctx + i;
        int32_t start[2] = {0, n_in}, seq_ctx = ctx + n_in, last = n_in - 1;
        atlas_batch b = {.n_tokens = n_in, .tokens = tokens, .positions = pos, .n_seqs = 1,
                         .seq_start = start, .seq_ctx = &seq_ctx, .block_table = table,
                         .max_blocks = max_blocks, .n_logits = 1, .logit_rows = &last};
        st = atlas_model_forward(m, &b, logits);
        if (st != ATLAS_OK) break;
        if (step == 0) memcpy(first_logits, logits, sizeof(float) * (size_t)vocab);
        int best = 0;
        for (int v = 1; v < vocab; v++)
            if (logits[v] > logits[best]) best = v;
        out[step] = best;
        ctx += n_in;
        tokens[0] = best;
        n_in = 1;
    }
    free(logits);
    return st;
}

static int cmp_word(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The lines of /usr/share/dict/words, lower-cased and sorted, for bsearch. Points into buf,
 * which it rewrites. */
static const char **dictionary_index(char *buf, size_t *n_out) {
    size_t n = 0, cap = 1;
    for (char *p = buf; *p; p++) cap += *p == '\n';
    const char **words = malloc(sizeof(char *) * cap);
    if (!words) return NULL;
    for (char *line = strtok(buf, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
        for (char *c = line; *c; c++) *c = (char)tolower((unsigned char)*c);
        words[n++] = line;
    }
    qsort(words, n, sizeof(char *), cmp_word);
    *n_out = n;
    return words;
}

/* Fraction of the alphabetic words of text that the dictionary lists. */
static double dictionary_fraction(const char *text, const char **words, size_t n_words) {
    int total = 0, found = 0;
    const char *p = text;
    while (*p) {
        while (*p && !isalpha((unsigned char)*p)) p++;
        const char *s = p;
        while (*p && isalpha((unsigned char)*p)) p++;
        size_t n = (size_t)(p - s);
        if (n == 0) continue;
        char w[64];
        if (n >= sizeof w) n = sizeof w - 1;
        for (size_t i = 0; i < n; i++) w[i] = (char)tolower((unsigned char)s[i]);
        w[n] = '\0';
        const char *key = w;
        total++;
        found += bsearch(&key, words, n_words, sizeof(char *), cmp_word) != NULL;
    }
    return total ? (double)found / total : 0.0;
}

static void check_case(atlas_model *m, json_t *c, const char **words, size_t n_words) {
    const atlas_tokenizer *tok = atlas_model_tokenizer(m);
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    json_t *ref_ids = json_object_get(c, "ids");
    json_t *ref_greedy = json_object_get(c, "greedy_ids");
    json_t *margins = json_object_get(c, "greedy_margins");
    CHECK(prompt && json_is_array(ref_ids) && json_is_array(ref_greedy));
    if (!prompt || !json_is_array(ref_ids) || !json_is_array(ref_greedy)) return;

    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK_OK(atlas_tokenizer_encode(tok, prompt, strlen(prompt), false, &ids, &n_ids));
    CHECK_MSG(n_ids == json_array_size(ref_ids), "%s: %zu ids, reference %zu", prompt, n_ids,
              json_array_size(ref_ids));
    for (size_t i = 0; i < n_ids && i < json_array_size(ref_ids); i++)
        CHECK(ids[i] == json_integer_value(json_array_get(ref_ids, i)));

    int n_new = (int)json_array_size(ref_greedy);
    int32_t out[64];
    float *logits = malloc(sizeof(float) * (size_t)atlas_model_vocab_size(m));
    CHECK_OK(greedy(m, ids, (int)n_ids, n_new, out, logits));

    /* last-position logits against the reference's top 16 */
    json_t *top_ids = json_object_get(c, "last_top_ids");
    json_t *top_val = json_object_get(c, "last_top_logits");
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < json_array_size(top_ids); i++) {
        double ref = json_real_value(json_array_get(top_val, i));
        double got = logits[json_integer_value(json_array_get(top_ids, i))];
        max_abs = fmax(max_abs, fabs(ref));
        max_diff = fmax(max_diff, fabs(ref - got));
    }
    CHECK_MSG(max_abs > 0 && max_diff / max_abs < 1e-4, "%s: logits differ by %g of %g",
              prompt, max_diff, max_abs);

    int same = 0;
    for (int i = 0; i < n_new; i++) {
        if (out[i] != json_integer_value(json_array_get(ref_greedy, i))) break;
        same++;
        if (json_real_value(json_array_get(margins, i)) < 1e-3) break;
    }
    int callable = 0;
    for (int i = 0; i < n_new; i++) {
        callable++;
        if (json_real_value(json_array_get(margins, i)) < 1e-3) break;
    }
    CHECK_MSG(same >= callable, "%s: greedy ids agree for %d steps, expected %d", prompt, same,
              callable);

    char *text = NULL;
    size_t len = 0;
    CHECK_OK(atlas_tokenizer_decode(tok, out, (size_t)n_new, true, &text, &len));
    if (text) {
        double frac = dictionary_fraction(text, words, n_words);
        printf("%s|%s  (%.0f%% dictionary words)\n", prompt, text, 100 * frac);
        CHECK_MSG(frac >= 0.8, "only %.0f%% of the words are in the dictionary", 100 * frac);
    }
    free(text);
    free(logits);
    free(ids);
}

int main(void) {
    const char *src = getenv("ATLAS_SOURCE_DIR");
    snprintf(model_dir, sizeof model_dir, "%s/models/default", src && *src ? src : ".");
    char ref_path[4200];
    snprintf(ref_path, sizeof ref_path, "%s/reference.json", model_dir);

    char *words = NULL;
    size_t words_len = 0;
    if (!harness_require_file("/usr/share/dict/words")) return harness_finish();
    CHECK_OK(atlas_file_read("/usr/share/dict/words", &words, &words_len));
    size_t n_words = 0;
    const char **index = words ? dictionary_index(words, &n_words) : NULL;
    CHECK(n_words > 50000);

    json_error_t jerr;
    json_t *ref = json_load_file(ref_path, 0, &jerr);
    CHECK_MSG(ref != NULL, "%s: %s", ref_path, jerr.text);

    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(model_dir, &p, &m));
    if (m && ref && index) {
        json_t *cases = json_object_get(ref, "cases");
        CHECK(json_array_size(cases) >= 4);
        for (size_t i = 0; i < json_array_size(cases); i++)
            check_case(m, json_array_get(cases, i), index, n_words);
    }
    CHECK_OK(atlas_model_release(m));
    json_decref(ref);
    free(index);
    free(words);
    return harness_finish();
}
