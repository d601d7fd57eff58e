/* fuzz/fuzz-tokenizer-json.c — libFuzzer target for tokenizer.json: the fast scanner of
 * model.vocab and model.merges (tok_bigjson_parse, on a private copy so that ASan knows the
 * exact bounds) and the whole loader (atlas_tokenizer_load_files, which reads a path: the
 * input is written to a file in a private temporary directory). A tokenizer that loads
 * encodes and decodes a fixed text; its ids must lie in the vocab. Errors are fine; crashes,
 * leaks, sanitizer reports and a failure without a message are not. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/tokenizer.h"
#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256], g_file[300];

static void cleanup(void) {
    unlink(g_file);
    rmdir(g_dir);
}

/* The file the loader reads, in a directory of this process's own. */
static const char *input_path(void) {
    if (!g_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/atlas-fuzz-tokjson-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_dir)) abort();
        snprintf(g_file, sizeof g_file, "%s/tokenizer.json", g_dir);
        atexit(cleanup);
    }
    return g_file;
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
}

static void check_failed(atlas_status st) {
    if (st != ATLAS_OK && !*atlas_last_error()) abort(); /* every failure says why */
}

/* The scanner alone: entries point into the buffer, and the rest is what is left of it. */
static void scan_only(const uint8_t *data, size_t size) {
    char *buf = malloc(size ? size : 1);
    if (!buf) return;
    memcpy(buf, data, size);
    tok_bigjson j;
    if (tok_bigjson_parse(buf, size, &j) == ATLAS_OK) {
        for (size_t i = 0; i < j.n_vocab; i++)
            if (j.vocab[i].p < buf || j.vocab[i].p + j.vocab[i].len > buf + size || j.vocab[i].id < 0)
                abort();
        for (size_t i = 0; i < j.n_merges; i++) {
            const tok_json_merge *m = &j.merges[i];
            if (m->a < buf || m->a + m->la > buf + size) abort();
            if (m->b && (m->b < buf || m->b + m->lb > buf + size)) abort();
        }
        if (j.rest_len > size || j.rest[j.rest_len]) abort();
        tok_bigjson_free(&j);
    }
    free(buf);
}

static const char TEXT[] = "Hello, world! 3.14159 \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 "
                           "<|endoftext|><s></s> don't\n\n\tend  ";

static void use(const atlas_tokenizer *tok) {
    size_t nv = atlas_tokenizer_vocab_size(tok);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        atlas_status st = atlas_tokenizer_encode(tok, TEXT, sizeof TEXT - 1, special, &ids, &n);
        check_failed(st);
        for (size_t i = 0; st == ATLAS_OK && i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= nv) abort();
        if (st == ATLAS_OK) {
            char *text = NULL;
            size_t len = 0;
            if (atlas_tokenizer_decode(tok, ids, n, special, &text, &len) != ATLAS_OK) abort();
            if (strlen(text) > len) abort();
            free(text);
        }
        free(ids);
    }
    /* Every token's bytes, through the streaming decoder too. */
    atlas_detok *d = NULL;
    if (atlas_detok_create(tok, false, &d) != ATLAS_OK) abort();
    for (size_t id = 0; id < nv && id < 4096; id++) {
        const char *b, *t;
        size_t bl, tl;
        if (atlas_tokenizer_token_bytes(tok, (int32_t)id, &b, &bl) != ATLAS_OK) abort();
        check_failed(atlas_detok_push(d, (int32_t)id, &t, &tl));
    }
    const char *t;
    size_t tl;
    check_failed(atlas_detok_flush(d, &t, &tl));
    atlas_detok_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    scan_only(data, size);
    const char *path = input_path();
    write_file(path, data, size);
    atlas_tokenizer *tok = NULL;
    atlas_status st = atlas_tokenizer_load_files(path, NULL, &tok);
    check_failed(st);
    if (st == ATLAS_OK) use(tok);
    atlas_tokenizer_free(tok);
    return 0;
}
