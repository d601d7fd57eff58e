/* fuzz/fuzz-tokenizer-config.c — libFuzzer target for tokenizer_config.json, read by both
 * of its readers: the tokenizer loader (added_tokens_decoder, bos/eos_token, add_bos_token;
 * atlas_tokenizer_load) and the chat template loader (chat_template as a string or a named
 * list, the special tokens; atlas_template_load). Both read a directory: the input is
 * written as tokenizer_config.json into a private temporary directory beside a small
 * byte-level tokenizer.json (tests/data/small/rope-llama3, 256 tokens). What loads is used:
 * a text with special tokens is encoded and decoded, the template renders a stock
 * conversation. Errors are fine; crashes, leaks, sanitizer reports and a failure without a
 * message are not. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "core/error.h"
#include "fuzz_fixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256], g_tok[300], g_cfg[300];

static void cleanup(void) {
    unlink(g_cfg);
    unlink(g_tok);
    rmdir(g_dir);
}

static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
}

/* A directory of this process's own holding the fixture's tokenizer.json. */
static const char *model_dir(void) {
    if (g_dir[0]) return g_dir;
    char fix[4096], src[4200];
    fuzz_fixture_dir(fix, sizeof fix, "small/rope-llama3", __FILE__);
    snprintf(src, sizeof src, "%s/tokenizer.json", fix);
    FILE *f = fopen(src, "rb");
    if (!f) {
        fprintf(stderr, "fuzz-tokenizer-config: cannot open %s (set ATLAS_TEST_DATA)\n", src);
        abort();
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/atlas-fuzz-tokcfg-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_tok, sizeof g_tok, "%s/tokenizer.json", g_dir);
    snprintf(g_cfg, sizeof g_cfg, "%s/tokenizer_config.json", g_dir);
    write_file(g_tok, buf, n);
    atexit(cleanup);
    return g_dir;
}

static void check_failed(atlas_status st) {
    if (st != ATLAS_OK && !*atlas_last_error()) abort(); /* every failure says why */
}

static const char TEXT[] = "<|begin_of_text|>Hi <|im_start|>user\nhello<|im_end|><s></s><|eot_id|> x";

static void use_tokenizer(const atlas_tokenizer *tok) {
    size_t nv = atlas_tokenizer_vocab_size(tok);
    int32_t bos = atlas_tokenizer_bos_id(tok), eos = atlas_tokenizer_eos_id(tok);
    if (bos >= (int32_t)nv || eos >= (int32_t)nv) abort();
    if ((bos >= 0) != (atlas_tokenizer_bos_token(tok) != NULL)) abort();
    if ((eos >= 0) != (atlas_tokenizer_eos_token(tok) != NULL)) abort();
    int32_t *ids = NULL;
    size_t n = 0;
    atlas_status st = atlas_tokenizer_encode(tok, TEXT, sizeof TEXT - 1, true, &ids, &n);
    check_failed(st);
    for (size_t i = 0; st == ATLAS_OK && i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= nv) abort();
    if (st == ATLAS_OK) {
        char *text = NULL;
        size_t len = 0;
        if (atlas_tokenizer_decode(tok, ids, n, false, &text, &len) != ATLAS_OK) abort();
        free(text);
    }
    free(ids);
    for (size_t i = 0; i < atlas_tokenizer_added_count(tok); i++) {
        const char *t;
        size_t len;
        int32_t id;
        bool special;
        if (atlas_tokenizer_added_token(tok, i, &t, &len, &id, &special) != ATLAS_OK) abort();
        if (id < 0 || (size_t)id >= nv) abort();
    }
}

static const char MESSAGES[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello.\"}, {\"role\": \"user\", \"content\": \"Bye\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = model_dir();
    write_file(g_cfg, data, size);
    atlas_tokenizer *tok = NULL;
    atlas_status st = atlas_tokenizer_load(dir, &tok);
    check_failed(st);
    if (st == ATLAS_OK) use_tokenizer(tok);
    atlas_tokenizer_free(tok);

    atlas_template *t = NULL;
    st = atlas_template_load(dir, &t);
    check_failed(st);
    if (st == ATLAS_OK) {
        if (!atlas_template_source(t) || !atlas_template_bos(t) || !atlas_template_eos(t)) abort();
        char *out = NULL;
        check_failed(atlas_template_render_str(t, MESSAGES, NULL, true, NULL, &out));
        free(out);
    }
    atlas_template_free(t);
    return 0;
}
