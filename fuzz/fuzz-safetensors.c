/* fuzz/fuzz-safetensors.c — libFuzzer target for the safetensors header parser.
 * Input: a whole safetensors file. Every view handed out must lie inside the input (ASan
 * reports it otherwise: the first and last byte of each tensor are read), and no two views
 * may share a byte. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int by_data(const void *a, const void *b) {
    const atlas_tensor_view *x = *(const atlas_tensor_view *const *)a;
    const atlas_tensor_view *y = *(const atlas_tensor_view *const *)b;
    const uint8_t *p = x->data, *q = y->data;
    return p < q ? -1 : p > q;
}

/* Accepted tensors never share a byte. */
static void check_disjoint(const atlas_st *st) {
    size_t n = atlas_st_count(st);
    const atlas_tensor_view **v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (atlas_st_at(st, i)->nbytes) v[k++] = atlas_st_at(st, i);
    qsort(v, k, sizeof *v, by_data);
    for (size_t i = 1; i < k; i++)
        if ((const uint8_t *)v[i - 1]->data + v[i - 1]->nbytes > (const uint8_t *)v[i]->data)
            abort();
    free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, so that reads past the end are caught at its exact bounds. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    atlas_st *st = NULL;
    if (atlas_st_open_memory(buf, size, "fuzz.safetensors", &st) == ATLAS_OK) {
        volatile uint8_t sink = 0;
        size_t total = 0;
        for (size_t i = 0; i < atlas_st_count(st); i++) {
            const atlas_tensor_view *t = atlas_st_at(st, i);
            if (atlas_st_find(st, t->name) != t) abort();
            if (t->nbytes) {
                const uint8_t *p = t->data;
                if (p < buf || p + t->nbytes > buf + size) abort();
                sink ^= p[0];
                sink ^= p[t->nbytes - 1];
            }
            total += t->nbytes;
        }
        if (total != atlas_st_total_bytes(st) || total > size) abort();
        check_disjoint(st);
        (void)sink;
    }
    atlas_st_free(st);
    free(buf);
    return 0;
}
