/* tests/test-tokenizer.c — the Llama 3 and Qwen3 tokenizers against the reference ids that
 * HF tokenizers produced (tests/data/tokenizer-*.json), decoding, incremental decoding,
 * padded ids, special tokens, and encoding from several threads at once. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "atlas/tokenizer.h"
#include "harness.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* An independent UTF-8 check (not the library's): utf8proc's iterator. */
static int valid_utf8(const char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (r <= 0) return 0;
        i += (size_t)r;
    }
    return 1;
}

static int ids_equal(const int32_t *a, size_t na, json_t *ref) {
    if (na != json_array_size(ref)) return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(ref, i))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Pushes ids one at a time: every piece is valid UTF-8 and all pieces make the decode. */
static void check_incremental(const atlas_tokenizer *tok, const int32_t *ids, size_t n,
                              const char *expect, size_t expect_len, const char *name) {
    atlas_detok *d;
    CHECK_OK(atlas_detok_create(tok, false, &d));
    size_t cap = expect_len + 64, len = 0;
    char *acc = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        CHECK_OK(atlas_detok_push(d, ids[i], &p, &pl));
        CHECK_MSG(valid_utf8(p, pl), "%s: piece %zu is not valid UTF-8", name, i);
        if (len + pl <= cap) memcpy(acc + len, p, pl);
        len += pl;
    }
    const char *p;
    size_t pl;
    CHECK_OK(atlas_detok_flush(d, &p, &pl));
    CHECK_MSG(pl == 0, "%s: leftover bytes after the last token", name);
    CHECK_MSG(len == expect_len && !memcmp(acc, expect, len), "%s: incremental decode differs", name);
    free(acc);
    atlas_detok_free(d);
}

/* Every case of tests/data/tokenizer-NAME.json: ids, ids_with_special, decode, detok. */
static void check_fixture(const atlas_tokenizer *tok, const char *name, int nfc) {
    char rel[64];
    snprintf(rel, sizeof rel, "tokenizer-%s.json", name);
    json_error_t err;
    json_t *root = json_load_file(harness_data_path(rel), 0, &err);
    CHECK_MSG(root != NULL, "%s: %s", rel, err.text);
    if (!root) return;
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) >= 40);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(atlas_tokenizer_encode(tok, text, len, special, &ids, &n));
            json_t *ref = json_object_get(c, special ? "ids_with_special" : "ids");
            int ok = ids_equal(ids, n, ref);
            CHECK_MSG(ok, "%s case %zu (%s) add_special=%d", name, i, text, special);
            if (!ok) {
                print_ids("got", ids, n);
                char *r = json_dumps(ref, 0);
                fprintf(stderr, "  want: %s\n", r);
                free(r);
            }
            if (!special) {
                /* decode gives the (normalized) text back */
                char *dec = NULL;
                size_t dl = 0;
                CHECK_OK(atlas_tokenizer_decode(tok, ids, n, false, &dec, &dl));
                char *want = (char *)text;
                size_t wl = len;
                if (nfc && len) {
                    utf8proc_uint8_t *w = NULL;
                    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                                      &w, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                    CHECK(r >= 0);
                    want = (char *)w;
                    wl = r >= 0 ? (size_t)r : 0;
                }
                CHECK_MSG(dec && dl == wl && !memcmp(dec, want, wl), "%s case %zu: decode", name, i);
                check_incremental(tok, ids, n, dec ? dec : "", dl, text);
                if (want != text) free(want);
                free(dec);
            }
            free(ids);
        }
    }
    json_decref(root);
}

static void check_long_runs(const atlas_tokenizer *tok);
static void check_roundtrip(const atlas_tokenizer *tok);
static void check_nfc(const atlas_tokenizer *tok);

static atlas_tokenizer *load(const char *model) {
    char rel[64];
    snprintf(rel, sizeof rel, "%s/tokenizer.json", model);
    if (!harness_require_file(harness_data_path(rel))) return NULL;
    snprintf(rel, sizeof rel, "%s", model);
    atlas_tokenizer *tok = NULL;
    double t0 = now_s();
    CHECK_OK(atlas_tokenizer_load(harness_data_path(rel), &tok));
    printf("%s: loaded in %.3f s\n", model, now_s() - t0);
    return tok;
}

static void check_llama3(void) {
    atlas_tokenizer *tok = load("tiny-llama3");
    if (!tok) return;
    CHECK(atlas_tokenizer_n_tokens(tok) == 128256);
    CHECK(atlas_tokenizer_bos_id(tok) == 128000);
    CHECK(atlas_tokenizer_eos_id(tok) == 128001);
    CHECK(!strcmp(atlas_tokenizer_bos_token(tok), "<|begin_of_text|>"));
    CHECK(atlas_tokenizer_token_id(tok, "<|eot_id|>") == 128009);
    CHECK(atlas_tokenizer_token_id(tok, "\xc4\xa0Hello") == 22691); /* "ĠHello" */
    CHECK(atlas_tokenizer_token_id(tok, "no such token here") == -1);
    CHECK(atlas_tokenizer_is_special(tok, 128009));
    CHECK(!atlas_tokenizer_is_special(tok, 22691));
    const char *b;
    size_t bl;
    CHECK_OK(atlas_tokenizer_token_bytes(tok, 22691, &b, &bl));
    CHECK(bl == 6 && !memcmp(b, " Hello", 6));
    CHECK(atlas_tokenizer_token_bytes(tok, 128256, &b, &bl) == ATLAS_ERR_RANGE);
    CHECK(atlas_tokenizer_token_bytes(tok, -1, &b, &bl) == ATLAS_ERR_RANGE);
    check_fixture(tok, "llama3", 0);
    check_long_runs(tok);
    check_roundtrip(tok);

    /* skip_special drops special tokens in decode and in incremental decode */
    int32_t ids[] = {128000, 9906, 128009};
    char *t;
    size_t tl;
    CHECK_OK(atlas_tokenizer_decode(tok, ids, 3, false, &t, &tl));
    CHECK(!strcmp(t, "<|begin_of_text|>Hello<|eot_id|>"));
    free(t);
    CHECK_OK(atlas_tokenizer_decode(tok, ids, 3, true, &t, &tl));
    CHECK(!strcmp(t, "Hello"));
    free(t);
    int32_t bad[] = {9906, 200000};
    CHECK(atlas_tokenizer_decode(tok, bad, 2, false, &t, &tl) == ATLAS_ERR_RANGE);
    CHECK(strstr(atlas_last_error(), "ids[1]") != NULL);

    /* a lone continuation byte and a truncated emoji decode to U+FFFD, not broken UTF-8 */
    int32_t emoji[16];
    size_t ne = 0;
    int32_t *e;
    CHECK_OK(atlas_tokenizer_encode(tok, "\xf0\x9f\x98\x80", 4, false, &e, &ne)); /* 😀 */
    CHECK(ne >= 2);
    memcpy(emoji, e, ne * sizeof *e);
    free(e);
    CHECK_OK(atlas_tokenizer_decode(tok, emoji, ne - 1, false, &t, &tl));
    CHECK(!strcmp(t, "\xef\xbf\xbd"));
    free(t);
    atlas_detok *d;
    CHECK_OK(atlas_detok_create(tok, true, &d));
    const char *p;
    size_t pl;
    CHECK_OK(atlas_detok_push(d, emoji[0], &p, &pl));
    CHECK(pl == 0);
    CHECK_OK(atlas_detok_push(d, 128009, &p, &pl)); /* skipped special in the middle */
    CHECK(pl == 0);
    CHECK_OK(atlas_detok_flush(d, &p, &pl));
    CHECK(pl == 3 && !memcmp(p, "\xef\xbf\xbd", 3));
    CHECK(atlas_detok_push(d, 1 << 20, &p, &pl) == ATLAS_ERR_RANGE);
    atlas_detok_free(d);

    /* invalid UTF-8 input is refused with its offset */
    int32_t *x = NULL;
    size_t nx = 0;
    CHECK(atlas_tokenizer_encode(tok, "ab\xff", 3, false, &x, &nx) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "byte 2") != NULL);
    atlas_tokenizer_free(tok);
}

static void check_qwen3(void) {
    atlas_tokenizer *tok = load("tiny-qwen3");
    if (!tok) return;
    CHECK(atlas_tokenizer_n_tokens(tok) == 151669);
    CHECK(atlas_tokenizer_bos_id(tok) == -1);
    CHECK(atlas_tokenizer_bos_token(tok) == NULL);
    CHECK(atlas_tokenizer_eos_id(tok) == 151645);
    CHECK(!strcmp(atlas_tokenizer_eos_token(tok), "<|im_end|>"));
    CHECK(atlas_tokenizer_is_special(tok, 151643));
    CHECK(!atlas_tokenizer_is_special(tok, 151667)); /* <think> is added, not special */
    check_fixture(tok, "qwen3", 1);
    check_nfc(tok);

    /* padded ids: valid once the model's vocab_size is known, and decode to "" */
    const char *b;
    size_t bl;
    CHECK(atlas_tokenizer_token_bytes(tok, 151700, &b, &bl) == ATLAS_ERR_RANGE);
    CHECK_OK(atlas_tokenizer_set_vocab_size(tok, 151936));
    CHECK(atlas_tokenizer_vocab_size(tok) == 151936);
    CHECK_OK(atlas_tokenizer_token_bytes(tok, 151700, &b, &bl));
    CHECK(bl == 0);
    CHECK(atlas_tokenizer_token_bytes(tok, 151936, &b, &bl) == ATLAS_ERR_RANGE);
    int32_t ids[] = {151700, 9707, 151935};
    char *t;
    size_t tl;
    CHECK_OK(atlas_tokenizer_decode(tok, ids, 3, false, &t, &tl));
    CHECK(!strcmp(t, "Hello"));
    free(t);
    atlas_tokenizer_free(tok);
}

/* Long runs: 300k spaces make the `\s+(?!\S)` match need a bigger regex JIT stack, and a
 * 300k-byte word goes through BPE and back unchanged. */
static void check_long_runs(const atlas_tokenizer *tok) {
    size_t n = 300000;
    char *text = malloc(n + 2);
    memset(text, ' ', n);
    text[n] = 'x';
    text[n + 1] = '\0';
    for (int k = 0; k < 2; k++) {
        if (k == 1) memset(text, 'a', n); /* one long letter run */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        CHECK_OK(atlas_tokenizer_encode(tok, text, n + 1, false, &ids, &n_ids));
        CHECK(n_ids > 0 && n_ids < n);
        char *dec = NULL;
        size_t dl = 0;
        CHECK_OK(atlas_tokenizer_decode(tok, ids, n_ids, false, &dec, &dl));
        CHECK(dec && dl == n + 1 && !memcmp(dec, text, dl));
        free(dec);
        free(ids);
    }
    free(text);
}

/* Random strings over a mixed alphabet (ASCII, Latin, Greek, CJK, emoji with modifiers,
 * combining marks, spaces of several kinds, pieces of special tokens): byte-level BPE with
 * no normalizer gives the exact text back, in one decode and piece by piece. */
static void check_roundtrip(const atlas_tokenizer *tok) {
    static const char *const alphabet[] = {
        "a", "b", "Z", "0", "7", " ", "  ", "\n", "\r\n", "\t", ".", "'s", "'T", "-", "_", "(",
        "\xc3\xa9", "e\xcc\x81", "\xce\xbb", "\xe4\xb8\xad", "\xe3\x83\x86",
        "\xf0\x9f\x91\x8d", "\xf0\x9f\x8f\xbd", "\xe2\x80\x8b", "\xc2\xa0", "\xe3\x80\x80",
        "<|", "|>", "<|eot_id|>", "<|begin_of_text|>", "\xd7\xa2", "\xef\xac\x81", "1234",
    };
    size_t na = sizeof alphabet / sizeof alphabet[0];
    unsigned seed = 12345;
    int bad = 0;
    for (int iter = 0; iter < 3000 && bad < 5; iter++) {
        char text[1024];
        size_t len = 0;
        int parts = 1 + iter % 40;
        for (int k = 0; k < parts; k++) {
            seed = seed * 1103515245u + 12345u;
            const char *a = alphabet[(seed >> 16) % na];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(atlas_tokenizer_encode(tok, text, len, false, &ids, &n));
        char *dec = NULL;
        size_t dl = 0;
        CHECK_OK(atlas_tokenizer_decode(tok, ids, n, false, &dec, &dl));
        int ok = dec && dl == len && !memcmp(dec, text, len);
        CHECK_MSG(ok, "roundtrip of random string %d", iter);
        bad += !ok;
        check_incremental(tok, ids, n, text, len, "random string");
        free(dec);
        free(ids);
    }
}

/* Qwen3's NFC normalizer on random strings that are and are not in NFC (combining marks,
 * Hangul jamo, kana + voicing mark, precomposed letters, CJK, singletons): the decode of
 * the ids is exactly utf8proc's NFC of the text, whichever path the normalizer took. */
static void check_nfc(const atlas_tokenizer *tok) {
    static const char *const alphabet[] = {
        "a", " ", "e", "\xcc\x81", "\xcc\xa3", "\xc3\xa9", "\xd0\xb8", "\xcc\x86", "\xd0\xb9",
        "\xe1\x84\x80", "\xe1\x85\xa1", "\xe1\x86\xa8", "\xea\xb0\x80", "\xe3\x81\x8b",
        "\xe3\x82\x99", "\xe3\x81\x8c", "\xe4\xb8\xad", "\xe2\x84\xab", "\xef\xac\x81",
        "\xe0\xa4\x95", "\xe0\xa4\xbc", "\xd8\xa7", "\xd9\x94", "\xe0\xb8\x81",
    };
    size_t na = sizeof alphabet / sizeof alphabet[0];
    unsigned seed = 777;
    int bad = 0;
    for (int iter = 0; iter < 3000 && bad < 5; iter++) {
        char text[512];
        size_t len = 0;
        for (int k = 0; k < 1 + iter % 24; k++) {
            seed = seed * 1103515245u + 12345u;
            const char *a = alphabet[(seed >> 16) % na];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        utf8proc_uint8_t *want = NULL;
        utf8proc_ssize_t wl = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &want,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        int32_t *ids = NULL;
        size_t n = 0;
        char *dec = NULL;
        size_t dl = 0;
        CHECK_OK(atlas_tokenizer_encode(tok, text, len, false, &ids, &n));
        CHECK_OK(atlas_tokenizer_decode(tok, ids, n, false, &dec, &dl));
        int ok = wl >= 0 && dec && dl == (size_t)wl && !memcmp(dec, want, dl);
        CHECK_MSG(ok, "NFC of random string %d", iter);
        bad += !ok;
        free(want);
        free(dec);
        free(ids);
    }
}

/* ---- several threads encoding with one tokenizer ------------------------------------------- */

typedef struct job {
    const atlas_tokenizer *tok;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int ok;
} job;

static void *encode_job(void *arg) {
    job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 4; r++) {
        int32_t *ids;
        size_t n;
        if (atlas_tokenizer_encode(j->tok, j->text, j->len, false, &ids, &n) != ATLAS_OK) j->ok = 0;
        else if (n != j->n_want || memcmp(ids, j->want, n * sizeof *ids)) j->ok = 0;
        free(ids);
    }
    return NULL;
}

static void check_threads(void) {
    atlas_tokenizer *tok = load("tiny-qwen3");
    if (!tok) return;
    /* a text with many distinct words: cache, regex and merges all busy */
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    for (int i = 0; len + 64 < cap; i++)
        len += (size_t)snprintf(text + len, cap - len, "word%d naïve café 中文%d, ", i * 7919 % 1000, i);
    int32_t *want;
    size_t n_want;
    CHECK_OK(atlas_tokenizer_encode(tok, text, len, false, &want, &n_want));
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){tok, text, len, want, n_want, 0};
        pthread_create(&th[i], NULL, encode_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(jobs[i].ok, "thread %d got different ids", i);
    }
    free(want);
    free(text);
    atlas_tokenizer_free(tok);
}

int main(void) {
    check_llama3();
    check_qwen3();
    check_threads();
    atlas_tokenizer_free(NULL);
    atlas_detok_free(NULL);
    return harness_finish();
}
