/* tests/test-safetensors.c — the safetensors reader on the fixtures, on a sharded split of
 * tiny-llama3 and on malformed files written at run time into a mkdtemp directory. Every
 * error case checks the status and that the message names the file and the tensor/field. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "atlas/status.h"
#include "core/error.h"
#include "core/file.h"
#include "harness.h"
#include "format/safetensors.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A safetensors file: the given header and data_len bytes of data (value i & 0xff). */
static void write_st(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + data_len + 1);
    put_u64(buf, hl);
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (unsigned char)i;
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

/* Opens path expecting `want`; the message must contain every non-NULL needle. */
static void expect_fail_file(const char *path, atlas_status want, const char *n1,
                             const char *n2) {
    atlas_st *st = (atlas_st *)1;
    atlas_status s = atlas_st_open_file(path, &st);
    const char *msg = atlas_last_error();
    if (getenv("ATLAS_TEST_VERBOSE")) printf("  %s\n", msg);
    CHECK_MSG(s == want, "%s: got %s (%s), want %s", path, atlas_status_str(s), msg,
              atlas_status_str(want));
    CHECK_MSG(st == NULL, "%s: out not cleared on failure", path);
    CHECK_MSG(strstr(msg, path) != NULL, "message does not name the file: %s", msg);
    if (n1) CHECK_MSG(strstr(msg, n1) != NULL, "message lacks '%s': %s", n1, msg);
    if (n2) CHECK_MSG(strstr(msg, n2) != NULL, "message lacks '%s': %s", n2, msg);
}

/* Writes header + data_len bytes to a fresh file named `name` and expects failure. */
static void expect_fail(const char *name, const char *header, size_t data_len,
                        atlas_status want, const char *n1, const char *n2) {
    const char *path = tmp_path(name);
    write_st(path, header, data_len);
    expect_fail_file(path, want, n1, n2);
}

/* ---- the fixtures ------------------------------------------------------------------------ */

/* A view's bytes must be exactly the file's bytes at 8 + N + begin (read here with stdio). */
static void check_views_match_file(const atlas_st *st, const char *path) {
    size_t len;
    unsigned char *raw = read_all(path, &len);
    CHECK(raw != NULL && len > 8);
    if (!raw) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    json_t *h = json_loadb((const char *)raw + 8, hl, 0, NULL);
    CHECK(h != NULL);
    size_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        n++;
        const atlas_tensor_view *t = atlas_st_find(st, key);
        CHECK_MSG(t != NULL, "%s: tensor %s not found", path, key);
        if (!t) continue;
        json_t *off = json_object_get(v, "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(off, 0));
        size_t e = (size_t)json_integer_value(json_array_get(off, 1));
        CHECK(t->nbytes == e - b);
        CHECK_MSG(!memcmp(t->data, raw + 8 + hl + b, e - b), "%s: %s data differs", path, key);
        /* the descriptor and offset that the CUDA loader preads from (core/file.h) */
        CHECK(t->fd >= 0 && t->file_offset == 8 + hl + b);
        unsigned char *got = malloc(e - b + 1);
        if (got && t->fd >= 0) {
            CHECK_OK(atlas_file_read_at(t->fd, got, e - b, t->file_offset));
            CHECK_MSG(!memcmp(got, raw + 8 + hl + b, e - b), "%s: %s: pread differs", path, key);
            /* one byte past the end of the file is an error that says so, not a short read */
            CHECK(atlas_file_read_at(t->fd, got, 1, len) == ATLAS_ERR_IO &&
                  strstr(atlas_last_error(), "end of file"));
        }
        free(got);
        CHECK(t->n_dims == (int)json_array_size(json_object_get(v, "shape")));
        CHECK(!strcmp(atlas_dtype_name(t->dtype), json_string_value(json_object_get(v, "dtype"))));
        CHECK(!strcmp(t->file, path));
    }
    CHECK(n == atlas_st_count(st));
    json_decref(h);
    free(raw);
}

static void test_fixtures(void) {
    static const struct {
        const char *dir;
        size_t n_model, n_ref;
        int64_t vocab;
    } fx[] = {{"tiny-llama3", 20, 42, 128256}, {"tiny-qwen3", 24, 42, 151936}};
    for (int i = 0; i < 2; i++) {
        char dir[1024], path[1100];
        snprintf(dir, sizeof dir, "%s", harness_data_path(fx[i].dir));
        atlas_st *st = NULL;
        CHECK_OK(atlas_st_open_dir(dir, &st));
        CHECK(atlas_st_count(st) == fx[i].n_model);
        const atlas_tensor_view *e = atlas_st_find(st, "model.embed_tokens.weight");
        CHECK(e && e->dtype == ATLAS_DTYPE_BF16 && e->n_dims == 2 && e->shape[0] == fx[i].vocab &&
              e->shape[1] == 16 && e->nbytes == (size_t)fx[i].vocab * 16 * 2);
        CHECK(atlas_st_find(st, "lm_head.weight") == NULL); /* tied */
        CHECK(atlas_st_find(st, "no.such.tensor") == NULL);
        size_t total = 0;
        for (size_t k = 0; k < atlas_st_count(st); k++) total += atlas_st_at(st, k)->nbytes;
        CHECK(total == atlas_st_total_bytes(st) && total > 0);
        CHECK(atlas_st_at(st, atlas_st_count(st)) == NULL);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        check_views_match_file(st, path);
        atlas_st_free(st);

        snprintf(path, sizeof path, "%s/reference.safetensors", dir);
        CHECK_OK(atlas_st_open_file(path, &st));
        CHECK(atlas_st_count(st) == fx[i].n_ref);
        const atlas_tensor_view *ids = atlas_st_find(st, "p0.ids");
        const atlas_tensor_view *lg = atlas_st_find(st, "p0.last_logits");
        CHECK(ids && ids->dtype == ATLAS_DTYPE_I32 && ids->n_dims == 1);
        CHECK(lg && lg->dtype == ATLAS_DTYPE_F32 && lg->shape[0] == fx[i].vocab);
        check_views_match_file(st, path);
        atlas_st_free(st);
    }
    atlas_st_free(NULL);
}

/* ---- sharded: tiny-llama3 split into 3 shards with an index -------------------------- */

/* Writes the tensors [lo, hi) of src into one safetensors file (offsets packed in order). */
static void write_shard(const atlas_st *src, size_t lo, size_t hi, const char *path,
                        const char *skip) {
    json_t *h = json_object();
    size_t off = 0;
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (size_t i = lo; i < hi; i++) {
        const atlas_tensor_view *t = atlas_st_at(src, i);
        if (skip && !strcmp(t->name, skip)) continue;
        json_t *shape = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(h, t->name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", atlas_dtype_name(t->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *hs = json_dumps(h, JSON_COMPACT);
    size_t hl = strlen(hs);
    unsigned char *buf = malloc(8 + hl + off);
    put_u64(buf, hl);
    memcpy(buf + 8, hs, hl);
    size_t p = 8 + hl;
    for (size_t i = lo; i < hi; i++) {
        const atlas_tensor_view *t = atlas_st_at(src, i);
        if (skip && !strcmp(t->name, skip)) continue;
        memcpy(buf + p, t->data, t->nbytes);
        p += t->nbytes;
    }
    write_bytes(path, buf, p);
    free(buf);
    free(hs);
    json_decref(h);
}

static void write_index(const atlas_st *src, const char *dir, const size_t *cut, int n_shards,
                        const char *extra_name, const char *extra_shard) {
    json_t *wm = json_object();
    for (int s = 0; s < n_shards; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        for (size_t i = cut[s]; i < cut[s + 1]; i++)
            json_object_set_new(wm, atlas_st_at(src, i)->name, json_string(name));
    }
    if (extra_name) json_object_set_new(wm, extra_name, json_string(extra_shard));
    json_t *root = json_pack("{s:{s:I},s:o}", "metadata", "total_size",
                             (json_int_t)atlas_st_total_bytes(src), "weight_map", wm);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
}

static void make_sharded(const atlas_st *src, const char *dir, const char *skip) {
    size_t n = atlas_st_count(src);
    size_t cut[4] = {0, n / 3, 2 * n / 3, n};
    mkdir(dir, 0700);
    for (int s = 0; s < 3; s++) {
        char path[512];
        snprintf(path, sizeof path, "%s/model-%05d-of-00003.safetensors", dir, s + 1);
        write_shard(src, cut[s], cut[s + 1], path, skip);
    }
    write_index(src, dir, cut, 3, NULL, NULL);
}

static void expect_dir_fail(const char *dir, atlas_status want, const char *n1, const char *n2,
                            const char *n3) {
    atlas_st *st = NULL;
    atlas_status s = atlas_st_open_dir(dir, &st);
    const char *msg = atlas_last_error();
    if (getenv("ATLAS_TEST_VERBOSE")) printf("  %s\n", msg);
    CHECK_MSG(s == want, "%s: got %s (%s)", dir, atlas_status_str(s), msg);
    CHECK(st == NULL);
    const char *ns[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (ns[i]) CHECK_MSG(strstr(msg, ns[i]) != NULL, "message lacks '%s': %s", ns[i], msg);
    atlas_st_free(st);
}

static void test_sharded(void) {
    atlas_st *src = NULL;
    CHECK_OK(atlas_st_open_dir(harness_data_path("tiny-llama3"), &src));
    if (!src) return;
    size_t n = atlas_st_count(src);

    const char *dir = tmp_path("sharded");
    make_sharded(src, dir, NULL);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_dir(dir, &st));
    CHECK(atlas_st_count(st) == n);
    CHECK(atlas_st_total_bytes(st) == atlas_st_total_bytes(src));
    for (size_t i = 0; st && i < n; i++) {
        const atlas_tensor_view *a = atlas_st_at(src, i);
        const atlas_tensor_view *b = atlas_st_find(st, a->name);
        CHECK_MSG(b != NULL, "%s missing from the sharded copy", a->name);
        if (!b) continue;
        CHECK(b->dtype == a->dtype && b->n_dims == a->n_dims && b->nbytes == a->nbytes);
        CHECK(!memcmp(b->shape, a->shape, sizeof a->shape));
        CHECK(!memcmp(b->data, a->data, a->nbytes));
        char want[64];
        snprintf(want, sizeof want, "model-%05zu-of-00003.safetensors",
                 i < n / 3 ? (size_t)1 : i < 2 * n / 3 ? (size_t)2 : (size_t)3);
        CHECK_MSG(strstr(b->file, want) != NULL, "%s: in %s, want %s", a->name, b->file, want);
    }
    atlas_st_free(st);

    /* Beside the index, a model.safetensors (one broken index beside it shows which is
     * read): the single file, as transformers loads it */
    const char *both = tmp_path("sharded-and-single");
    make_sharded(src, both, atlas_st_at(src, n / 3)->name);
    size_t slen;
    unsigned char *single = read_all(harness_data_path("tiny-llama3/model.safetensors"), &slen);
    char spath[4096];
    snprintf(spath, sizeof spath, "%s/model.safetensors", both);
    if (single) write_bytes(spath, single, slen);
    free(single);
    st = NULL;
    CHECK_OK(atlas_st_open_dir(both, &st));
    CHECK(atlas_st_count(st) == n);
    CHECK(st && strstr(atlas_st_at(st, 0)->file, "model.safetensors") &&
          !strstr(atlas_st_at(st, 0)->file, "-of-"));
    atlas_st_free(st);

    /* A tensor the index places in shard 2 that shard 2 lacks. */
    const char *victim = atlas_st_at(src, n / 3)->name;
    const char *dir2 = tmp_path("sharded-missing");
    make_sharded(src, dir2, victim);
    expect_dir_fail(dir2, ATLAS_ERR_NOT_FOUND, "model.safetensors.index.json", victim,
                    "model-00002-of-00003.safetensors");

    /* The index names a shard file that does not exist. */
    const char *dir3 = tmp_path("sharded-noshard");
    make_sharded(src, dir3, NULL);
    size_t cut[4] = {0, n / 3, 2 * n / 3, n};
    write_index(src, dir3, cut, 3, "extra.weight", "model-00009-of-00009.safetensors");
    expect_dir_fail(dir3, ATLAS_ERR_IO, "model-00009-of-00009.safetensors", NULL, NULL);

    /* No weights at all. */
    const char *empty = tmp_path("empty-dir");
    mkdir(empty, 0700);
    expect_dir_fail(empty, ATLAS_ERR_NOT_FOUND, empty, "model.safetensors", NULL);

    atlas_st_free(src);
}

/* Index files that disagree with their shards or are malformed. */
static void test_sharded_errors(void) {
    atlas_st *src = NULL;
    CHECK_OK(atlas_st_open_dir(harness_data_path("tiny-llama3"), &src));
    if (!src) return;
    size_t n = atlas_st_count(src);
    const char *dir3 = tmp_path("sharded-badindex");
    make_sharded(src, dir3, NULL);
    size_t cut[4] = {0, n / 3, 2 * n / 3, n};

    /* A tensor indexed in the wrong (existing) shard. */
    write_index(src, dir3, cut, 3, NULL, NULL);
    char ipath[512];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir3);
    json_t *idx = json_load_file(ipath, 0, NULL);
    json_object_set_new(json_object_get(idx, "weight_map"), atlas_st_at(src, 0)->name,
                        json_string("model-00003-of-00003.safetensors"));
    json_dump_file(idx, ipath, 0);
    expect_dir_fail(dir3, ATLAS_ERR_NOT_FOUND, atlas_st_at(src, 0)->name,
                    "model-00001-of-00003.safetensors", "index.json");

    /* Shard names must stay inside the directory. */
    json_object_set_new(json_object_get(idx, "weight_map"), atlas_st_at(src, 0)->name,
                        json_string("../escape.safetensors"));
    json_dump_file(idx, ipath, 0);
    expect_dir_fail(dir3, ATLAS_ERR_FORMAT, "../escape.safetensors", atlas_st_at(src, 0)->name,
                    "index.json");
    /* weight_map of the wrong type, and bad JSON with its position. */
    write_bytes(ipath, "{\"weight_map\": []}", 18);
    expect_dir_fail(dir3, ATLAS_ERR_FORMAT, "weight_map", "index.json", NULL);
    write_bytes(ipath, "{\"weight_map\": {\"a\": 3}}", 24);
    expect_dir_fail(dir3, ATLAS_ERR_FORMAT, "weight_map", "\"a\"", NULL);
    write_bytes(ipath, "{\"weight_map\": {", 16);
    expect_dir_fail(dir3, ATLAS_ERR_FORMAT, "index.json", "byte 16", NULL);
    json_decref(idx);

    /* The same tensor in two shards. */
    const char *dir4 = tmp_path("sharded-dup");
    make_sharded(src, dir4, NULL);
    char p1[512];
    snprintf(p1, sizeof p1, "%s/model-00003-of-00003.safetensors", dir4);
    write_shard(src, 2 * n / 3 - 1, n, p1, NULL); /* shard 3 also holds shard 2's last tensor */
    expect_dir_fail(dir4, ATLAS_ERR_FORMAT, atlas_st_at(src, 2 * n / 3 - 1)->name,
                    "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors");
    atlas_st_free(src);
}

/* ---- malformed single files ----------------------------------------------------------- */

static void test_fixture_damage(void) {
    size_t len;
    char src[1024];
    snprintf(src, sizeof src, "%s", harness_data_path("tiny-llama3/model.safetensors"));
    unsigned char *raw = read_all(src, &len);
    CHECK(raw != NULL);
    if (!raw) return;
    /* Truncated inside the data: the last tensor by offset runs past the end. */
    const char *p = tmp_path("truncated.safetensors");
    write_bytes(p, raw, len - 10);
    expect_fail_file(p, ATLAS_ERR_FORMAT, "out of range", "model.norm.weight");
    /* Truncated inside the header, and before the length. */
    write_bytes(p, raw, 500);
    expect_fail_file(p, ATLAS_ERR_FORMAT, "header length", NULL);
    write_bytes(p, raw, 5);
    expect_fail_file(p, ATLAS_ERR_FORMAT, "truncated", NULL);
    write_bytes(p, raw, 0);
    expect_fail_file(p, ATLAS_ERR_FORMAT, "truncated", NULL);
    /* Header length far past the end (and one that would wrap around). */
    const char *q = tmp_path("hugelen.safetensors");
    put_u64(raw, (uint64_t)len * 4);
    write_bytes(q, raw, len);
    expect_fail_file(q, ATLAS_ERR_FORMAT, "header length", "past the end");
    put_u64(raw, UINT64_MAX - 3);
    write_bytes(q, raw, len);
    expect_fail_file(q, ATLAS_ERR_FORMAT, "header length", NULL);
    /* A header length a few bytes short still parses (the JSON's trailing padding), and
     * would read every tensor a few bytes off: the data section must be filled exactly. */
    free(raw);
    raw = read_all(src, &len); /* the length as written again */
    if (!raw) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    put_u64(raw, hl - 3);
    write_bytes(q, raw, len);
    expect_fail_file(q, ATLAS_ERR_FORMAT, "the tensors fill", "header length");
    free(raw);
    expect_fail_file(tmp_path("does-not-exist.safetensors"), ATLAS_ERR_IO, "cannot open", NULL);
}

static void test_bad_headers(void) {
    /* Bad JSON: the message gives the position in the file: the stray ',' is header byte 23
     * (1-based), file byte 8 + 23. */
    expect_fail("badjson.st", "{\"a\": {\"dtype\": \"F32\",, }}", 0, ATLAS_ERR_FORMAT,
                "header JSON", "byte 31 ");
    expect_fail("notobj.st", "[1, 2]", 0, ATLAS_ERR_FORMAT, "not an object", NULL);
    expect_fail("dupname.st",
                "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                8, ATLAS_ERR_FORMAT, "duplicate", "\"w\"");
    expect_fail("dtype.st",
                "{\"layer.w\": {\"dtype\": \"Q4_K\", \"shape\": [2], \"data_offsets\": [0, 2]}}",
                2, ATLAS_ERR_FORMAT, "layer.w", "unknown dtype \"Q4_K\"");
    expect_fail("dtype64.st",
                "{\"layer.w\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}",
                8, ATLAS_ERR_UNSUPPORTED, "layer.w", "F64");
    expect_fail("dtypetype.st",
                "{\"layer.w\": {\"dtype\": 7, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                ATLAS_ERR_FORMAT, "layer.w", "\"dtype\"");
    expect_fail("negdim.st",
                "{\"neg.w\": {\"dtype\": \"F32\", \"shape\": [2, -3], \"data_offsets\": [0, 24]}}",
                24, ATLAS_ERR_FORMAT, "neg.w", "shape[1]");
    expect_fail("realdim.st",
                "{\"real.w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8,
                ATLAS_ERR_FORMAT, "real.w", "shape[0]");
    expect_fail("shapeobj.st",
                "{\"s.w\": {\"dtype\": \"F32\", \"shape\": {}, \"data_offsets\": [0, 8]}}", 8,
                ATLAS_ERR_FORMAT, "s.w", "\"shape\"");
    expect_fail("overflow.st",
                "{\"big.w\": {\"dtype\": \"BF16\", \"shape\": [4611686018427387904, "
                "4611686018427387904], \"data_offsets\": [0, 8]}}",
                8, ATLAS_ERR_FORMAT, "big.w", "overflow");
    expect_fail("toomanydims.st",
                "{\"d.w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                "\"data_offsets\": [0, 1]}}", 1, ATLAS_ERR_UNSUPPORTED, "d.w", "dimensions");
    expect_fail("bigint.st",
                "{\"h.w\": {\"dtype\": \"U8\", \"shape\": [99999999999999999999999], "
                "\"data_offsets\": [0, 1]}}", 1, ATLAS_ERR_FORMAT, "header JSON", "byte");
    static const char *const bad_offsets[] = {"[0]", "[0, 4, 8]", "[\"0\", 4]", "{}", "[4, 0]",
                                              "[-4, 0]", "[0.0, 4]"};
    for (size_t i = 0; i < sizeof bad_offsets / sizeof bad_offsets[0]; i++) {
        char h[256];
        snprintf(h, sizeof h,
                 "{\"off.w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": %s}}",
                 bad_offsets[i]);
        expect_fail("offsets.st", h, 8, ATLAS_ERR_FORMAT, "off.w", "data_offsets");
    }
    expect_fail("range.st",
                "{\"a.w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                " \"far.w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
                12, ATLAS_ERR_FORMAT, "far.w", "out of range");
    /* Overlap is found whatever the header order: ranges are sorted by offset first. */
    expect_fail("overlap.st",
                "{\"late.w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]},"
                " \"first.w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}",
                24, ATLAS_ERR_FORMAT, "late.w", "first.w");
    /* An empty tensor between two overlapping ones does not hide the overlap. */
    expect_fail("overlap-empty.st",
                "{\"a.w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                " \"e.w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]},"
                " \"b.w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}",
                20, ATLAS_ERR_FORMAT, "'b.w'", "'a.w'");
    /* A long tensor that contains two later ones. */
    expect_fail("overlap-inside.st",
                "{\"big.w\": {\"dtype\": \"U8\", \"shape\": [32], \"data_offsets\": [0, 32]},"
                " \"s1.w\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [32, 36]},"
                " \"s2.w\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
                36, ATLAS_ERR_FORMAT, "'s2.w'", "'big.w'");
    /* The tensors must fill the data section: no gap between them, none after them. */
    expect_fail("gap.st",
                "{\"a.w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                " \"b.w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                12, ATLAS_ERR_FORMAT, "'b.w'", "a gap");
    expect_fail("tail.st",
                "{\"a.w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                8, ATLAS_ERR_FORMAT, "fill 4 bytes of the 8-byte", NULL);
    expect_fail("mismatch.st",
                "{\"mm.w\": {\"dtype\": \"BF16\", \"shape\": [3, 4], \"data_offsets\": [0, 12]}}",
                12, ATLAS_ERR_FORMAT, "mm.w", "need 24");
    expect_fail("notentry.st", "{\"e.w\": [1, 2]}", 0, ATLAS_ERR_FORMAT, "e.w", "not an object");
    expect_fail("nodtype.st", "{\"e.w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                ATLAS_ERR_FORMAT, "e.w", "dtype");
    expect_fail("metabad.st", "{\"__metadata__\": [1]}", 0, ATLAS_ERR_FORMAT, "__metadata__",
                NULL);
    expect_fail("nul.st", "{\"a\\u0000b\": {}}", 0, ATLAS_ERR_FORMAT, "header JSON", NULL);
}

/* Well-formed oddities that must open: metadata skipped, a scalar, an empty tensor,
 * header padding with spaces, and unsorted offsets. */
static void test_good_small(void) {
    const char *path = tmp_path("good.st");
    write_st(path,
             "{\"__metadata__\": {\"format\": \"pt\"},"
             " \"b\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [4, 20]},"
             " \"scalar\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
             " \"empty\": {\"dtype\": \"F16\", \"shape\": [0, 7], \"data_offsets\": [4, 4]},"
             " \"c\": {\"dtype\": \"U8\", \"shape\": [1, 1, 3], \"data_offsets\": [20, 23]}}    ",
             23);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    CHECK(atlas_st_count(st) == 4);
    CHECK(atlas_st_find(st, "__metadata__") == NULL);
    const atlas_tensor_view *s = atlas_st_find(st, "scalar");
    const atlas_tensor_view *b = atlas_st_find(st, "b");
    const atlas_tensor_view *e = atlas_st_find(st, "empty");
    const atlas_tensor_view *c = atlas_st_find(st, "c");
    CHECK(s && s->n_dims == 0 && s->nbytes == 4 && s->dtype == ATLAS_DTYPE_F32);
    CHECK(b && b->dtype == ATLAS_DTYPE_I64 && b->nbytes == 16);
    CHECK(e && e->nbytes == 0 && e->shape[0] == 0 && e->shape[1] == 7);
    CHECK(c && c->n_dims == 3 && ((const unsigned char *)c->data)[0] == 20 &&
          ((const unsigned char *)c->data)[2] == 22);
    if (b) CHECK(((const unsigned char *)b->data)[0] == 4);
    CHECK(atlas_st_total_bytes(st) == 23);
    atlas_st_free(st);

    /* The same bytes from memory. */
    size_t len;
    unsigned char *raw = read_all(path, &len);
    CHECK_OK(atlas_st_open_memory(raw, len, "in-memory", &st));
    CHECK(atlas_st_count(st) == 4);
    CHECK(st && !strcmp(atlas_st_at(st, 0)->file, "in-memory"));
    for (size_t i = 0; st && i < atlas_st_count(st); i++) CHECK(atlas_st_at(st, i)->fd == -1);
    atlas_st_free(st);
    st = (atlas_st *)1;
    CHECK(atlas_st_open_memory(raw, 3, "short", &st) == ATLAS_ERR_FORMAT && st == NULL);
    CHECK(strstr(atlas_last_error(), "short") != NULL);
    free(raw);
}

/* ---- open must not read tensor data: an 8B-shaped checkpoint, sparse, 4 shards ---------- */

/* Writes Llama-3-8B-shaped shards (sparse: headers only, the data is a hole) and their index
 * into dir. Returns 0 when the file system cannot make sparse files. */
static int write_8b_checkpoint(const char *dir, uint64_t *total, int *n_tensors) {
    static const struct {
        const char *name;
        int64_t rows, cols;
    } layer[] = {
        {"input_layernorm.weight", 4096, 0},          {"self_attn.q_proj.weight", 4096, 4096},
        {"self_attn.k_proj.weight", 1024, 4096},      {"self_attn.v_proj.weight", 1024, 4096},
        {"self_attn.o_proj.weight", 4096, 4096},      {"post_attention_layernorm.weight", 4096, 0},
        {"mlp.gate_proj.weight", 14336, 4096},        {"mlp.up_proj.weight", 14336, 4096},
        {"mlp.down_proj.weight", 4096, 14336},
    };
    mkdir(dir, 0700);
    json_t *wm = json_object();
    *total = 0;
    *n_tensors = 0;
    for (int s = 0; s < 4; s++) {
        json_t *h = json_object();
        uint64_t off = 0;
        char shard[64], name[128];
        snprintf(shard, sizeof shard, "model-%05d-of-00004.safetensors", s + 1);
        for (int l = s * 8; l < s * 8 + 8; l++)
            for (int k = 0; k < 9; k++) {
                snprintf(name, sizeof name, "model.layers.%d.%s", l, layer[k].name);
                uint64_t nb = (uint64_t)layer[k].rows * (layer[k].cols ? layer[k].cols : 1) * 2;
                json_t *shape = layer[k].cols ? json_pack("[I,I]", layer[k].rows, layer[k].cols)
                                              : json_pack("[I]", layer[k].rows);
                json_object_set_new(h, name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", "BF16",
                                                       "shape", shape, "data_offsets",
                                                       (json_int_t)off, (json_int_t)(off + nb)));
                json_object_set_new(wm, name, json_string(shard));
                off += nb;
                (*n_tensors)++;
            }
        const char *extra[2] = {s == 0 ? "model.embed_tokens.weight" : NULL,
                                s == 3 ? "lm_head.weight" : NULL};
        for (int x = 0; x < 2; x++) {
            if (!extra[x]) continue;
            uint64_t nb = (uint64_t)128256 * 4096 * 2;
            json_object_set_new(h, extra[x], json_pack("{s:s,s:[I,I],s:[I,I]}", "dtype", "BF16",
                                                       "shape", (json_int_t)128256,
                                                       (json_int_t)4096, "data_offsets",
                                                       (json_int_t)off, (json_int_t)(off + nb)));
            json_object_set_new(wm, extra[x], json_string(shard));
            off += nb;
            (*n_tensors)++;
        }
        char *hs = json_dumps(h, JSON_COMPACT);
        size_t hl = strlen(hs);
        unsigned char lenb[8];
        put_u64(lenb, hl);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
        int ok = fd >= 0 && write(fd, lenb, 8) == 8 && write(fd, hs, hl) == (ssize_t)hl &&
                 ftruncate(fd, (off_t)(8 + hl + off)) == 0; /* sparse: no data written */
        if (fd >= 0) close(fd);
        free(hs);
        json_decref(h);
        *total += off;
        if (!ok) {
            json_decref(wm);
            return 0;
        }
    }
    json_t *root = json_pack("{s:o}", "weight_map", wm);
    char ipath[512];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    json_dump_file(root, ipath, 0);
    json_decref(root);
    return 1;
}

static void test_open_speed(void) {
    const char *dir = tmp_path("llama8b");
    uint64_t total;
    int n_tensors;
    if (!write_8b_checkpoint(dir, &total, &n_tensors)) {
        printf("SKIP open speed: cannot create sparse files in %s\n", dir);
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_dir(dir, &st));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK(atlas_st_count(st) == (size_t)n_tensors && n_tensors == 290);
    CHECK(atlas_st_total_bytes(st) == total);
    printf("opened an 8B-shaped checkpoint (%d tensors, %.2f GB, 4 shards) in %.2f ms\n",
           n_tensors, total / 1e9, ms);
    /* Reading 16 GB would take seconds; parsing four headers takes milliseconds. */
    CHECK_MSG(ms < 500, "open took %.1f ms", ms);
    atlas_st_free(st);
}

int main(void) {
    if (!harness_mkdtemp(tmpdir, sizeof tmpdir, "st")) return 2;
    test_fixtures();
    test_sharded();
    test_sharded_errors();
    test_fixture_damage();
    test_bad_headers();
    test_good_small();
    test_open_speed();
    harness_rm_rf(tmpdir);
    return harness_finish();
}
