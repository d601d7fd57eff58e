/* fuzz/fuzz-index-json.c — libFuzzer target for model.safetensors.index.json, the list of
 * shards (atlas_st_open_dir, which reads a directory: the input is written as the index into
 * a private temporary directory beside two small shards, model-00001-of-00002.safetensors
 * with tensors a and b, model-00002-of-00002.safetensors with c). A checkpoint that opens
 * must hold every tensor the index names, each found by its name, its bytes inside a shard.
 * Errors are fine; crashes, leaks, sanitizer reports and a failure without a message are
 * not. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const SHARD_NAME[2] = {"model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"};
static const char *const SHARD_HEADER[2] = {
    "{\"__metadata__\": {\"format\": \"pt\"}, "
    "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
    "\"b\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [8, 12]}}",
    "{\"c\": {\"dtype\": \"F16\", \"shape\": [1, 2], \"data_offsets\": [0, 4]}}"};
static const size_t SHARD_DATA[2] = {12, 4};

static char g_dir[256], g_path[3][300];

static void cleanup(void) {
    for (int i = 0; i < 3; i++) unlink(g_path[i]);
    rmdir(g_dir);
}

static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
}

/* A directory of this process's own holding the two shards; returns the index's path. */
static const char *index_path(void) {
    if (g_dir[0]) return g_path[2];
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/atlas-fuzz-index-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    for (int i = 0; i < 2; i++) {
        unsigned char buf[512] = {0};
        uint64_t n = strlen(SHARD_HEADER[i]);
        for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(n >> (8 * b));
        memcpy(buf + 8, SHARD_HEADER[i], n);
        for (size_t b = 0; b < SHARD_DATA[i]; b++) buf[8 + n + b] = (unsigned char)(b + 1);
        snprintf(g_path[i], sizeof g_path[i], "%s/%s", g_dir, SHARD_NAME[i]);
        write_file(g_path[i], buf, 8 + n + SHARD_DATA[i]);
    }
    snprintf(g_path[2], sizeof g_path[2], "%s/model.safetensors.index.json", g_dir);
    atexit(cleanup);
    return g_path[2];
}

/* What opened: every tensor findable by name with its bytes readable, every indexed one
 * present. */
static void check_opened(const atlas_st *st, const uint8_t *data, size_t size) {
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < atlas_st_count(st); i++) {
        const atlas_tensor_view *t = atlas_st_at(st, i);
        if (atlas_st_find(st, t->name) != t) abort();
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
    }
    (void)sink;
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(root, "weight_map"), key, v)
        if (!atlas_st_find(st, key)) abort();
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_file(index_path(), data, size);
    atlas_st *st = NULL;
    atlas_status s = atlas_st_open_dir(g_dir, &st);
    if (s != ATLAS_OK && !*atlas_last_error()) abort(); /* every failure says why */
    if (s == ATLAS_OK) check_opened(st, data, size);
    atlas_st_free(st);
    return 0;
}
