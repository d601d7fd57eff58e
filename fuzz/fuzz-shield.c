/* fuzz/fuzz-shield.c — libFuzzer target for the chat shield (atlas/shield.h) with the Qwen3
 * tokenizer. Input: any bytes, as client text (when valid UTF-8) and as rendered text.
 * Checked: shielding then spelling back gives the text again; the shielded text tokenizes
 * to the same ids as the text tokenized with every special token refused; arbitrary rendered
 * text (cut and foreign sentinels included) tokenizes without a crash. Errors are fine;
 * crashes, leaks, sanitizer reports and disagreements are not. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/shield.h"
#include "atlas/tokenizer.h"
#include "fuzz_fixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static atlas_tokenizer *tokenizer(void) {
    static atlas_tokenizer *tok; /* loaded once: it never changes */
    if (!tok) {
        char dir[1024];
        fuzz_fixture_dir(dir, sizeof dir, "tiny-qwen3", __FILE__);
        if (atlas_tokenizer_load(dir, &tok) != ATLAS_OK) abort();
    }
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    atlas_tokenizer *tok = tokenizer();
    const char *s = (const char *)data;
    int32_t *ids = NULL;
    size_t n = 0;
    if (atlas_shield_encode(tok, s, size, false, &ids, &n) == ATLAS_OK) free(ids);
    json_t *v = json_stringn(s, size); /* NULL unless valid UTF-8 without NUL */
    if (!v) return 0;
    if (atlas_shield_json(tok, v) == ATLAS_OK) {
        char *back = NULL;
        size_t len = 0;
        if (atlas_shield_text(tok, json_string_value(v), json_string_length(v), &back, &len) ==
            ATLAS_OK) {
            if (len != size || (size && memcmp(back, s, size))) abort(); /* the round trip */
            free(back);
        }
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        atlas_text_range all = {0, size};
        if (atlas_shield_encode(tok, json_string_value(v), json_string_length(v), false, &a,
                                &na) == ATLAS_OK &&
            atlas_tokenizer_encode_ranges(tok, s, size, false, &all, 1, &b, &nb) == ATLAS_OK &&
            (na != nb || (na && memcmp(a, b, na * sizeof *a))))
            abort(); /* client text is text */
        free(a);
        free(b);
    }
    json_decref(v);
    return 0;
}
