/* tests/test-tokenizer-variants.c — tokenizer.json features the two fixture files do not
 * use, on files this test writes: the real Llama 3 TemplateProcessing post-processor (BOS),
 * BOS+EOS templates, merge ranks in both JSON forms, Split behaviors, added-token flags
 * (lstrip, rstrip, single_word, normalized), normalizers, and malformed or unsupported
 * files, each of which must fail with an error that says where. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/tokenizer.h"
#include "harness.h"

static char tmpdir[] = "/tmp/atlas-tok-XXXXXX";

/* GPT-2's bytes_to_unicode, written independently of the library. */
static void byte_char(int b, char out[3]) {
    int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int i = 0; i < b; i++)
            n += !((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || i >= 0xae);
        cp = 0x100 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

/* A small byte-level BPE: ids 0..255 are the bytes themselves, then these merges. */
static const char *const MERGES[][2] = {
    {"a", "b"},         /* 256 "ab" */
    {"ab", "c"},        /* 257 "abc" */
    {"\xc4\xa0", "a"},  /* 258 "Ġa" */
    {"-", "-"},         /* 259 */
    {"a", "-"},         /* 260 */
    {"-", "b"},         /* 261 */
    {"1", "2"},         /* 262 */
};

/* Writes a tokenizer.json with the given JSON snippets (NULL: null) and loads it. */
static atlas_status make(const char *name, int pair_merges, const char *normalizer,
                         const char *pretok, const char *added, const char *post,
                         atlas_tokenizer **out) {
    json_t *vocab = json_object(), *merges = json_array();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (size_t i = 0; i < sizeof MERGES / sizeof MERGES[0]; i++) {
        char m[16];
        snprintf(m, sizeof m, "%s%s", MERGES[i][0], MERGES[i][1]);
        json_object_set_new(vocab, m, json_integer(256 + (int)i));
        if (pair_merges) {
            json_array_append_new(merges, json_pack("[ss]", MERGES[i][0], MERGES[i][1]));
        } else {
            snprintf(m, sizeof m, "%s %s", MERGES[i][0], MERGES[i][1]);
            json_array_append_new(merges, json_string(m));
        }
    }
    json_error_t err;
#define PARSE(s) ((s) ? json_loads((s), 0, &err) : json_null())
    json_t *root = json_pack("{s:s, s:o, s:o, s:o, s:o, s:{s:s}, s:{s:s, s:o, s:o, s:b}}",
                             "version", "1.0", "added_tokens", added ? PARSE(added) : json_array(),
                             "normalizer", PARSE(normalizer), "pre_tokenizer", PARSE(pretok),
                             "post_processor", PARSE(post), "decoder", "type", "ByteLevel",
                             "model", "type", "BPE", "vocab", vocab, "merges", merges,
                             "ignore_merges", 0);
#undef PARSE
    if (!root) {
        fprintf(stderr, "bad JSON in test %s: %s\n", name, err.text);
        return ATLAS_ERR_INTERNAL;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/%s.json", tmpdir, name);
    json_dump_file(root, path, 0);
    json_decref(root);
    return atlas_tokenizer_load_files(path, NULL, out);
}

static const char BYTELEVEL[] =
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}";

/* Encodes text and compares with want (terminated by -1). */
static void expect(const atlas_tokenizer *tok, const char *text, bool special, const int32_t *want,
                   const char *what) {
    int32_t *ids = NULL;
    size_t n = 0, nw = 0;
    while (want[nw] >= 0) nw++;
    CHECK_OK(atlas_tokenizer_encode(tok, text, strlen(text), special, &ids, &n));
    int ok = n == nw && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    CHECK_MSG(ok, "%s: '%s'", what, text);
    if (!ok) {
        fprintf(stderr, "  got:");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
}
#define EXPECT(tok, text, special, what, ...) \
    expect(tok, text, special, (const int32_t[]){__VA_ARGS__, -1}, what)

static void check_merges(void) {
    for (int pair = 0; pair < 2; pair++) {
        atlas_tokenizer *tok = NULL;
        CHECK_OK(make(pair ? "pairs" : "strings", pair, NULL, BYTELEVEL, NULL, NULL, &tok));
        if (!tok) continue;
        EXPECT(tok, "abc", false, "merges", 257);
        /* "a b" (rank 0) goes before "Ġ a" (rank 2), then "ab c": Ġ + abc */
        EXPECT(tok, " abc", false, "merge ranks", 32, 257);
        EXPECT(tok, " a", false, "merges", 258);
        EXPECT(tok, "xab yab", false, "regex split", 120, 256, 32, 121, 256);
        atlas_tokenizer_free(tok);
    }
}

/* Invalid UTF-8 decodes like Rust's String::from_utf8_lossy: one U+FFFD per maximal
 * invalid subpart; the incremental decoder agrees piece by piece.  Ids here are bytes. */
static void check_lossy(void) {
    atlas_tokenizer *tok = NULL;
    CHECK_OK(make("lossy", 0, NULL, BYTELEVEL, NULL, NULL, &tok));
    if (!tok) return;
    static const struct {
        int32_t ids[6];
        const char *want;
    } cases[] = {
        {{0xf0, 0x9f, 0x98, 'A', -1}, "\xef\xbf\xbd" "A"},           /* truncated emoji */
        {{0xe0, 0x80, -1}, "\xef\xbf\xbd\xef\xbf\xbd"},             /* E0 needs A0..BF */
        {{0xed, 0xa0, 0x80, -1}, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {{0xc0, 0xaf, -1}, "\xef\xbf\xbd\xef\xbf\xbd"},             /* overlong */
        {{0xf4, 0x90, 0x80, 0x80, -1}, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {{0xe2, 0x82, 0xac, 0xe2, 0x82, -1}, "\xe2\x82\xac\xef\xbf\xbd"}, /* euro + cut */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        while (cases[i].ids[n] >= 0) n++;
        char *t = NULL;
        size_t tl = 0;
        CHECK_OK(atlas_tokenizer_decode(tok, cases[i].ids, n, false, &t, &tl));
        CHECK_MSG(t && tl == strlen(cases[i].want) && !memcmp(t, cases[i].want, tl), "lossy case %zu", i);
        free(t);
        atlas_detok *d;
        CHECK_OK(atlas_detok_create(tok, false, &d));
        char acc[64];
        size_t al = 0;
        for (size_t k = 0; k < n; k++) {
            const char *p;
            size_t pl;
            CHECK_OK(atlas_detok_push(d, cases[i].ids[k], &p, &pl));
            if (al + pl <= sizeof acc) memcpy(acc + al, p, pl);
            al += pl;
        }
        const char *p;
        size_t pl;
        CHECK_OK(atlas_detok_flush(d, &p, &pl));
        if (al + pl <= sizeof acc) memcpy(acc + al, p, pl);
        al += pl;
        CHECK_MSG(al == strlen(cases[i].want) && !memcmp(acc, cases[i].want, al), "lossy detok case %zu", i);
        atlas_detok_free(d);
    }
    atlas_tokenizer_free(tok);
}

static void check_split_behaviors(void) {
    static const struct {
        const char *behavior;
        int invert;
        int32_t want[8];
    } cases[] = {
        {"Removed", 0, {97, 98, 99, -1}},
        {"Isolated", 0, {97, 45, 98, 45, 45, 99, -1}},
        {"MergedWithPrevious", 0, {260, 98, 45, 45, 99, -1}},
        {"MergedWithNext", 0, {97, 261, 45, 45, 99, -1}},
        {"Contiguous", 0, {97, 45, 98, 259, 99, -1}},
        {"Removed", 1, {45, 45, 45, -1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char pre[512];
        snprintf(pre, sizeof pre,
                 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                 "{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\","
                 "\"add_prefix_space\":false,\"use_regex\":false}]}",
                 cases[i].behavior, cases[i].invert ? "true" : "false");
        atlas_tokenizer *tok = NULL;
        CHECK_OK(make("split", 0, NULL, pre, NULL, NULL, &tok));
        if (!tok) continue;
        expect(tok, "a-b--c", false, cases[i].want, cases[i].behavior);
        atlas_tokenizer_free(tok);
    }
    /* Digits: each digit alone, or runs of digits */
    for (int individual = 0; individual < 2; individual++) {
        char pre[512];
        snprintf(pre, sizeof pre,
                 "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":%s},"
                 "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}",
                 individual ? "true" : "false");
        atlas_tokenizer *tok = NULL;
        CHECK_OK(make("digits", 0, NULL, pre, NULL, NULL, &tok));
        if (!tok) continue;
        if (individual) EXPECT(tok, "ab12c", false, "Digits individual", 256, 49, 50, 99);
        else EXPECT(tok, "ab12c", false, "Digits contiguous", 256, 262, 99);
        atlas_tokenizer_free(tok);
    }
    /* ByteLevel add_prefix_space puts a space before the text */
    atlas_tokenizer *tok = NULL;
    CHECK_OK(make("prefix", 0, NULL,
                  "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", NULL,
                  NULL, &tok));
    if (tok) {
        EXPECT(tok, "abc", false, "add_prefix_space", 32, 257);
        EXPECT(tok, " a", false, "add_prefix_space", 258);
        atlas_tokenizer_free(tok);
    }
}

static void check_added_flags(void) {
    const char *added =
        "[{\"id\":300,\"content\":\"<m>\",\"lstrip\":true,\"special\":true,\"normalized\":false},"
        " {\"id\":301,\"content\":\"<n>\",\"rstrip\":true,\"special\":true,\"normalized\":false},"
        " {\"id\":302,\"content\":\"zz\",\"single_word\":true,\"special\":false,\"normalized\":false},"
        " {\"id\":303,\"content\":\"Hi\",\"special\":false,\"normalized\":true},"
        " {\"id\":304,\"content\":\"Q\",\"special\":false,\"normalized\":false},"
        " {\"id\":305,\"content\":\"<m>x\",\"special\":true,\"normalized\":false},"
        " {\"id\":306,\"content\":\"zQ\",\"special\":false,\"normalized\":false}]";
    atlas_tokenizer *tok = NULL;
    CHECK_OK(make("added", 0, "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Lowercase\"}]}",
                  BYTELEVEL, added, NULL, &tok));
    if (!tok) return;
    EXPECT(tok, "c <m>", false, "lstrip eats the spaces before", 99, 300);
    EXPECT(tok, "c <n> c", false, "rstrip eats the spaces after", 99, 32, 301, 99);
    EXPECT(tok, "zz c", false, "single_word alone", 302, 32, 99);
    EXPECT(tok, "azz", false, "single_word inside a word", 97, 122, 122);
    EXPECT(tok, "zz_", false, "single_word before _", 122, 122, 95);
    /* a combining mark is part of a word (Rust's \w), a dash is not */
    EXPECT(tok, "c\xcc\xb0zz", false, "single_word after a combining mark", 99, 204, 176, 122, 122);
    EXPECT(tok, "-zz", false, "single_word after a dash", 45, 302);
    /* a refused match is consumed: "zQ" may not start inside the refused "zz" */
    EXPECT(tok, "azzQ", false, "single_word refused, then plain", 97, 122, 122, 304);
    /* "Hi" is matched on the normalized (lowercased) text, "Q" on the raw text */
    EXPECT(tok, "HI c", false, "normalized added token", 303, 32, 99);
    EXPECT(tok, "Q", false, "raw added token", 304);
    EXPECT(tok, "q", false, "raw added token is case-sensitive", 113);
    EXPECT(tok, "<m>xy", false, "longest added token wins", 305, 121);
    /* the normalizer: NFC composes e + U+0301, then Lowercase */
    EXPECT(tok, "E\xcc\x81", false, "NFC + Lowercase", 195, 169);
    CHECK(atlas_tokenizer_token_id(tok, "<n>") == 301);
    CHECK(atlas_tokenizer_is_special(tok, 301));
    CHECK(!atlas_tokenizer_is_special(tok, 302));
    atlas_tokenizer_free(tok);
}

static void check_bos_eos_template(void) {
    const char *added = "[{\"id\":256,\"content\":\"<s>\",\"special\":true},"
                        " {\"id\":257,\"content\":\"</s>\",\"special\":true}]";
    const char *post =
        "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],"
        "\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[256],\"tokens\":[\"<s>\"]},"
        "\"</s>\":{\"id\":\"</s>\",\"ids\":[257],\"tokens\":[\"</s>\"]}}}";
    atlas_tokenizer *tok = NULL;
    CHECK_OK(make("bos-eos", 0, NULL, BYTELEVEL, added, post, &tok));
    if (!tok) return;
    EXPECT(tok, "c", true, "BOS + EOS", 256, 99, 257);
    EXPECT(tok, "c", false, "no special", 99);
    CHECK(atlas_tokenizer_bos_id(tok) == 256);
    atlas_tokenizer_free(tok);
}

/* The Llama 3 tokenizer.json with the post-processor that real Llama 3 checkpoints ship. */
static void check_llama3_template(void) {
    const char *src = harness_data_path("tiny-llama3/tokenizer.json");
    if (!harness_require_file(src)) return;
    json_error_t err;
    json_t *root = json_load_file(src, 0, &err);
    CHECK(root != NULL);
    if (!root) return;
    json_t *post = json_loads(
        "{\"type\":\"Sequence\",\"processors\":["
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},"
        "{\"type\":\"TemplateProcessing\","
        "\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
        "\"pair\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
        "{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\",\"type_id\":1}},"
        "{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
        "\"special_tokens\":{\"<|begin_of_text|>\":{\"id\":\"<|begin_of_text|>\","
        "\"ids\":[128000],\"tokens\":[\"<|begin_of_text|>\"]}}}]}",
        0, &err);
    CHECK(post != NULL);
    json_object_set_new(root, "post_processor", post);
    char path[256];
    snprintf(path, sizeof path, "%s/llama3-bos.json", tmpdir);
    CHECK(json_dump_file(root, path, JSON_COMPACT) == 0);
    json_decref(root);
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load_files(path, NULL, &tok));
    if (!tok) return;
    EXPECT(tok, "hello world", true, "Llama 3 BOS", 128000, 15339, 1917);
    EXPECT(tok, "hello world", false, "Llama 3 no BOS", 15339, 1917);
    EXPECT(tok, "", true, "Llama 3 BOS alone", 128000);
    EXPECT(tok, "<|begin_of_text|>hi", true, "Llama 3 BOS twice", 128000, 128000, 6151);
    CHECK(atlas_tokenizer_bos_id(tok) == 128000); /* from the template: no config given */
    CHECK(atlas_tokenizer_bos_token(tok) && !strcmp(atlas_tokenizer_bos_token(tok), "<|begin_of_text|>"));
    atlas_tokenizer_free(tok);
}

/* ---- malformed and unsupported files ------------------------------------------------------ */

static void expect_fail(atlas_status st, atlas_status want, const char *needle, const char *what) {
    CHECK_MSG(st == want, "%s: got %s, want %s", what, atlas_status_str(st), atlas_status_str(want));
    CHECK_MSG(strstr(atlas_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
              atlas_last_error(), needle);
}

static void write_file(const char *name, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void check_errors(void) {
    atlas_tokenizer *tok = NULL;
    expect_fail(make("bert", 0, "{\"type\":\"BertNormalizer\"}", BYTELEVEL, NULL, NULL, &tok),
                ATLAS_ERR_UNSUPPORTED, "normalizer.type 'BertNormalizer'", "unsupported normalizer");
    CHECK(tok == NULL);
    expect_fail(make("nfc-seq", 0, "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"StripAccents\"}]}",
                     BYTELEVEL, NULL, NULL, &tok),
                ATLAS_ERR_UNSUPPORTED, "normalizer.normalizers[1].type 'StripAccents'", "nested normalizer");
    expect_fail(make("ws", 0, NULL, "{\"type\":\"Whitespace\"}", NULL, NULL, &tok),
                ATLAS_ERR_UNSUPPORTED, "pre_tokenizer.type 'Whitespace'", "unsupported pre-tokenizer");
    expect_fail(make("nobl", 0, NULL, NULL, NULL, NULL, &tok), ATLAS_ERR_UNSUPPORTED,
                "no ByteLevel", "no ByteLevel");
    expect_fail(make("badre", 0, NULL,
                     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
                     "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\"}]}",
                     NULL, NULL, &tok),
                ATLAS_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern: regex error", "bad regex");
    expect_fail(make("roberta", 0, NULL, BYTELEVEL, NULL, "{\"type\":\"RobertaProcessing\"}", &tok),
                ATLAS_ERR_UNSUPPORTED, "post_processor.type 'RobertaProcessing'", "unsupported post-processor");
    expect_fail(make("addbad", 0, NULL, BYTELEVEL, "[{\"id\":-3,\"content\":\"x\"}]", NULL, &tok),
                ATLAS_ERR_FORMAT, "added_tokens[0]", "bad added token id");
}

static void check_file_errors(void) {
    atlas_tokenizer *tok = NULL;
    char path[256], cfg[256];
    write_file("trunc.json", "{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0", path, sizeof path);
    expect_fail(atlas_tokenizer_load_files(path, NULL, &tok), ATLAS_ERR_FORMAT, "trunc.json:2:",
                "truncated JSON");
    write_file("wp.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", path, sizeof path);
    expect_fail(atlas_tokenizer_load_files(path, NULL, &tok), ATLAS_ERR_UNSUPPORTED,
                "model.type 'WordPiece'", "WordPiece");
    write_file("merge.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},"
               " \"merges\": [\"a b\", \"ab c\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
               " \"decoder\": {\"type\": \"ByteLevel\"}}",
               path, sizeof path);
    expect_fail(atlas_tokenizer_load_files(path, NULL, &tok), ATLAS_ERR_FORMAT,
                "model.merges[1]: token 'c' is not in the vocab", "merge of an unknown token");
    write_file("merge-form.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}",
               path, sizeof path);
    expect_fail(atlas_tokenizer_load_files(path, NULL, &tok), ATLAS_ERR_FORMAT, "model.merges[0]",
                "bad merge form");
    /* a real where an id belongs: the fast scanner refuses it, jansson says where */
    write_file("real-id.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0.5}, \"merges\": []},"
               " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
               path, sizeof path);
    expect_fail(atlas_tokenizer_load_files(path, NULL, &tok), ATLAS_ERR_FORMAT,
                "model.vocab.a: expected an integer id", "real id");
    write_file("merge3.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a a\"]},"
               " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
               path, sizeof path);
    expect_fail(atlas_tokenizer_load_files(path, NULL, &tok), ATLAS_ERR_FORMAT,
                "model.merges[0]: expected \"a b\"", "merge with two spaces");
    /* escapes in vocab strings are decoded: \u0120 is the byte-level space */
    write_file("esc.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u0120\": 0, \"x\": 1, \"\\u0120x\": 2},"
               " \"merges\": [\"\\u0120 x\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\","
               " \"add_prefix_space\": false}, \"decoder\": {\"type\": \"ByteLevel\"}}",
               path, sizeof path);
    CHECK_OK(atlas_tokenizer_load_files(path, NULL, &tok));
    if (tok) {
        EXPECT(tok, " x", false, "escaped vocab", 2);
        atlas_tokenizer_free(tok);
        tok = NULL;
    }
    snprintf(path, sizeof path, "%s/strings.json", tmpdir); /* written by check_merges */
    write_file("cfg.json", "{\"bos_token\": \"<nope>\"}", cfg, sizeof cfg);
    expect_fail(atlas_tokenizer_load_files(path, cfg, &tok), ATLAS_ERR_FORMAT,
                "bos_token '<nope>' is not a token", "config bos not a token");
    write_file("cfg2.json", "{\"bos_token\": {\"content\": \"a\"}, \"eos_token\": \"b\"}", cfg, sizeof cfg);
    CHECK_OK(atlas_tokenizer_load_files(path, cfg, &tok));
    if (tok) {
        CHECK(atlas_tokenizer_bos_id(tok) == 97 && atlas_tokenizer_eos_id(tok) == 98);
        atlas_tokenizer_free(tok);
        tok = NULL;
    }
    /* add_bos_token / add_eos_token add them when tokenizer.json's post-processor does not */
    write_file("cfg3.json",
               "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token\": {\"__type\": "
               "\"AddedToken\", \"content\": \"a\"}, \"eos_token\": \"b\"}", cfg, sizeof cfg);
    CHECK_OK(atlas_tokenizer_load_files(path, cfg, &tok));
    if (tok) {
        EXPECT(tok, "c", true, "add_bos_token + add_eos_token", 97, 99, 98);
        EXPECT(tok, "c", false, "add_bos_token, no special", 99);
        atlas_tokenizer_free(tok);
        tok = NULL;
    }
    write_file("cfg4.json", "{\"add_bos_token\": true}", cfg, sizeof cfg);
    expect_fail(atlas_tokenizer_load_files(path, cfg, &tok), ATLAS_ERR_FORMAT,
                "add_bos_token is true but there is no bos_token", "add_bos_token without bos");
    expect_fail(atlas_tokenizer_load("/nonexistent-dir", &tok), ATLAS_ERR_IO,
                "/nonexistent-dir/tokenizer.json", "missing file");
    CHECK(tok == NULL);
}

/* `atlas tokenize`, as a real process (ATLAS_BIN is set by ctest). */
static void check_cli(void) {
    const char *bin = getenv("ATLAS_BIN");
    if (!bin || !*bin || access(bin, X_OK) != 0) {
        CHECK_MSG(0, "ATLAS_BIN is not set to the atlas binary");
        return;
    }
    char cmd[8192], out[256] = "";
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' 'hello world' 2>&1", bin,
             harness_data_path("tiny-llama3"));
    CHECK(harness_run(cmd, out, sizeof out) == 0);
    CHECK_MSG(!strcmp(out, "[15339, 1917]\n"), "atlas tokenize printed '%s'", out);
    snprintf(cmd, sizeof cmd, "printf 'a<|endoftext|>b' | '%s' tokenize -m '%s' - 2>&1", bin,
             harness_data_path("tiny-qwen3"));
    CHECK(harness_run(cmd, out, sizeof out) == 0);
    CHECK_MSG(!strcmp(out, "[64, 151643, 65]\n"), "atlas tokenize - printed '%s'", out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m /nonexistent x 2>&1", bin);
    int st = harness_run(cmd, out, sizeof out);
    CHECK(st > 0); /* an error exit, not a crash (-1) */
    CHECK_MSG(strstr(out, "/nonexistent/tokenizer.json") &&
                  strchr(out, '\n') == out + strlen(out) - 1,
              "error is not one line naming the file: '%s'", out);
}

int main(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    check_merges();
    check_lossy();
    check_split_behaviors();
    check_added_flags();
    check_bos_eos_template();
    check_llama3_template();
    check_errors();
    check_file_errors();
    check_cli();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return harness_finish();
}
