/* fuzz/fuzz-constraint.c — libFuzzer target for constraint programs and the matcher.
 * Input: a program, then a stream.
 *   program: N (1 byte, N % 5 segments), then per segment a kind byte (% 4):
 *            0 LITERAL: length (% 16) and the bytes;  1 CHOICE: count (% 4 + 1) options,
 *            each a length (% 8) and the bytes (NUL ends an option early);  2 JSON_OBJECT;
 *            3 a JSON value: its kind (low 7 bits % 11, atlas_constraint_json_kind; the
 *            high bit: nullable).
 *   stream:  the rest, read twice:
 *            - as token ids (2 bytes each) over a vocabulary of every single byte plus some
 *              multi-byte pieces and one empty token: each step the mask must agree with
 *              accept (allowed <=> accepted; a refused token leaves the state alone);
 *            - as raw bytes into a JSON_OBJECT-only program: whatever completes must parse
 *              with jansson as an object.
 *   Input that is JSON is also compiled as a response_format schema (src/server/schema.c)
 *   and the program walked with the stream's tokens.
 * Errors are fine (with a message); crashes, leaks, sanitizer reports and disagreements
 * are not. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/constraint.h"
#include "atlas/status.h"
#include "server/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const PIECES[] = {
    "{\"", "\":", "\",", "\"}", "}}", "]}", "[{", "\\u", "\\ud83d", "\\ude00", "true", "false",
    "null", "-0.5e+1", "12", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "<tool_call>",
    "\n</tool_call>", "{\"name\": \"", "\", \"arguments\": ", "  ", "\t\n", "\xc3", "\xa9", "",
};
enum { N_PIECES = sizeof PIECES / sizeof *PIECES, N_VOCAB = 256 + N_PIECES };

static atlas_constraint_vocab *vocab(void) {
    static atlas_constraint_vocab *v; /* built once: it never changes */
    if (v) return v;
    static char singles[256];
    const char *bytes[N_VOCAB];
    size_t lens[N_VOCAB];
    for (int i = 0; i < 256; i++) {
        singles[i] = (char)i;
        bytes[i] = &singles[i];
        lens[i] = 1;
    }
    for (int i = 0; i < N_PIECES; i++) {
        bytes[256 + i] = PIECES[i];
        lens[256 + i] = strlen(PIECES[i]);
    }
    if (atlas_constraint_vocab_new(bytes, lens, N_VOCAB, &v) != ATLAS_OK) abort();
    return v;
}

static void check_failed(atlas_status st) {
    if (st != ATLAS_OK && !*atlas_last_error()) abort(); /* every failure says why */
}

/* Reads the program; returns the bytes used. */
static size_t read_program(const uint8_t *d, size_t n, atlas_constraint *c) {
    size_t i = 0;
    if (i >= n) return i;
    int segs = d[i++] % 5;
    for (int s = 0; s < segs && i < n; s++) {
        int kind = d[i++] % 4;
        if (kind == 2) {
            check_failed(atlas_constraint_add_json_object(c));
        } else if (kind == 3 && i < n) {
            int k = d[i++];
            check_failed(atlas_constraint_add_json_value(
                c, (k & 0x7F) % 11 | (k & 0x80 ? ATLAS_CONSTRAINT_JSON_NULLABLE : 0)));
        } else if (kind == 0 && i < n) {
            size_t len = d[i++] % 16;
            if (len > n - i) len = n - i;
            check_failed(atlas_constraint_add_literal(c, (const char *)d + i, len));
            i += len;
        } else if (kind == 1 && i < n) {
            int k = d[i++] % 4 + 1;
            char opts[4][9];
            const char *p[4];
            for (int o = 0; o < k; o++) {
                size_t len = i < n ? d[i++] % 8 : 0;
                if (len > n - i) len = n - i;
                memcpy(opts[o], d + i, len);
                opts[o][len] = 0;
                p[o] = opts[o];
                i += len;
            }
            check_failed(atlas_constraint_add_choice(c, p, k));
        }
    }
    return i;
}

static void token_walk(const atlas_constraint *c, const uint8_t *d, size_t n) {
    atlas_constraint_matcher *m = NULL;
    atlas_status st = atlas_constraint_matcher_new(c, vocab(), &m);
    check_failed(st);
    if (st != ATLAS_OK) return;
    uint8_t mask[N_VOCAB + 3];
    for (size_t i = 0; i + 1 < n; i += 2) {
        int na = atlas_constraint_matcher_allowed(m, mask, N_VOCAB + 3);
        int count = 0;
        for (int k = 0; k < N_VOCAB + 3; k++) count += mask[k];
        if (count != na || mask[N_VOCAB] || mask[N_VOCAB - 1]) abort(); /* "" never */
        if (atlas_constraint_matcher_done(m) && na != 0) abort();
        int id = (d[i] | d[i + 1] << 8) % N_VOCAB;
        st = atlas_constraint_matcher_accept(m, id);
        check_failed(st);
        if ((st == ATLAS_OK) != (mask[id] == 1)) abort();
        if (st != ATLAS_OK) { /* the state did not move: the same mask again */
            uint8_t again[N_VOCAB];
            atlas_constraint_matcher_allowed(m, again, N_VOCAB);
            if (memcmp(again, mask, N_VOCAB)) abort();
        }
    }
    atlas_constraint_matcher_free(m);
}

static void json_bytes(const uint8_t *d, size_t n) {
    atlas_constraint *c = NULL;
    if (atlas_constraint_new(&c) != ATLAS_OK) return;
    atlas_constraint_matcher *m = NULL;
    if (atlas_constraint_add_json_object(c) == ATLAS_OK &&
        atlas_constraint_matcher_new(c, NULL, &m) == ATLAS_OK) {
        size_t i = 0;
        while (i < n && !atlas_constraint_matcher_done(m) &&
               atlas_constraint_matcher_accept_bytes(m, (const char *)d + i, 1) == ATLAS_OK)
            i++;
        if (atlas_constraint_matcher_done(m)) {
            json_t *j = json_loadb((const char *)d, i, 0, NULL);
            if (!json_is_object(j)) abort();
            json_decref(j);
        }
    }
    atlas_constraint_matcher_free(m);
    atlas_constraint_free(c);
}

static void schema(const uint8_t *data, size_t size) {
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!j) return;
    atlas_constraint *c = NULL;
    atlas_status st = atlas_schema_program(j, "schema", &c);
    check_failed(st);
    if (st == ATLAS_OK) token_walk(c, data, size);
    atlas_constraint_free(c);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    schema(data, size);
    atlas_constraint *c = NULL;
    if (atlas_constraint_new(&c) != ATLAS_OK) return 0;
    size_t used = read_program(data, size, c);
    token_walk(c, data + used, size - used);
    atlas_constraint *copy = NULL;
    if (atlas_constraint_copy(c, &copy) == ATLAS_OK &&
        atlas_constraint_n_segments(copy) != atlas_constraint_n_segments(c))
        abort();
    atlas_constraint_free(copy);
    atlas_constraint_free(c);
    json_bytes(data + used, size - used);
    json_bytes(data, size);
    return 0;
}
