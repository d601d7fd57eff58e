/* format/safetensors.c — see safetensors.h.
 *
 * Opening never touches tensor data: the files are mapped and only the JSON headers are
 * read, so an 8B checkpoint opens in milliseconds. Every header is validated completely
 * before any view is handed out; a bad file leaves nothing behind. */
#include "format/safetensors.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/error.h"
#include "core/file.h"

/* The reference implementation refuses headers above 100 MB; so do we (a corrupt length
 * must not make us parse gigabytes of tensor data as JSON). */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct st_file {
    char *path;         /* as given to open; named in every message */
    atlas_file_map map; /* zeroed for atlas_st_open_memory (the caller owns the bytes) */
} st_file;

struct atlas_st {
    st_file *files;
    size_t n_files;
    atlas_tensor_view *tensors; /* in file order, then offset order */
    size_t n_tensors, cap_tensors;
    const atlas_tensor_view **by_name; /* sorted by name, for atlas_st_find */
    size_t total_bytes;
};

/* One tensor of one header while it is checked (offsets relative to the data section). */
typedef struct st_entry {
    const char *name; /* borrowed from the JSON */
    atlas_dtype dtype;
    int n_dims;
    int64_t shape[ATLAS_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

static const struct {
    const char *name;
    int dtype; /* atlas_dtype, or -1: a safetensors dtype that atlas does not handle */
} st_dtypes[] = {
    {"F32", ATLAS_DTYPE_F32},   {"F16", ATLAS_DTYPE_F16},      {"BF16", ATLAS_DTYPE_BF16},
    {"I32", ATLAS_DTYPE_I32},   {"I64", ATLAS_DTYPE_I64},      {"U8", ATLAS_DTYPE_U8},
    {"F64", -1},                {"I8", -1},                    {"I16", -1},
    {"U16", -1},                {"U32", -1},                   {"U64", -1},
    {"BOOL", -1},               {"F8_E4M3", ATLAS_DTYPE_F8_E4M3},               {"F8_E5M2", -1},
    {"F8_E8M0", -1},            {"F4", -1},                    {"F6_E2M3", -1},
    {"F6_E3M2", -1},            {"C64", -1},
};

static atlas_status parse_dtype(const char *file, const char *tensor, json_t *v,
                                atlas_dtype *out) {
    if (!json_is_string(v))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", file,
                          tensor);
    const char *s = json_string_value(v);
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(s, st_dtypes[i].name) != 0) continue;
        if (st_dtypes[i].dtype < 0)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED,
                              "%s: tensor '%s': dtype %s is not supported (F32, F16, BF16, I32, "
                              "I64, U8, F8_E4M3 are)", file, tensor, s);
        *out = (atlas_dtype)st_dtypes[i].dtype;
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%.32s\"", file, tensor,
                      s);
}

static atlas_status parse_shape(const char *file, const char *tensor, json_t *v, st_entry *e) {
    if (!json_is_array(v))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", file,
                          tensor);
    size_t n = json_array_size(v);
    if (n > ATLAS_MAX_DIMS)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions (at most %d)",
                          file, tensor, n, ATLAS_MAX_DIMS);
    e->n_dims = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not an integer",
                              file, tensor, i);
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': shape[%zu] = %lld is negative",
                              file, tensor, i, (long long)x);
        e->shape[i] = (int64_t)x;
    }
    return ATLAS_OK;
}

static atlas_status parse_offsets(const char *file, const char *tensor, json_t *v, st_entry *e) {
    if (!json_is_array(v) || json_array_size(v) != 2 ||
        !json_is_integer(json_array_get(v, 0)) || !json_is_integer(json_array_get(v, 1)))
        return atlas_fail(ATLAS_ERR_FORMAT,
                          "%s: tensor '%s': \"data_offsets\" is not two integers [begin, end]",
                          file, tensor);
    json_int_t b = json_integer_value(json_array_get(v, 0));
    json_int_t en = json_integer_value(json_array_get(v, 1));
    if (b < 0 || en < b)
        return atlas_fail(ATLAS_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] are not 0 <= begin <= end",
                          file, tensor, (long long)b, (long long)en);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    return ATLAS_OK;
}

/* Checks that the byte count matches product(shape) * dtype size, without overflow. */
static atlas_status check_size(const char *file, const st_entry *e) {
    uint64_t count = atlas_dtype_size(e->dtype);
    for (int i = 0; i < e->n_dims; i++) {
        uint64_t d = (uint64_t)e->shape[i];
        if (d != 0 && count > UINT64_MAX / d)
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': shape overflows 64 bits", file,
                              e->name);
        count *= d;
    }
    if (count != e->end - e->begin)
        return atlas_fail(ATLAS_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape "
                          "and dtype %s need %llu", file, e->name, (unsigned long long)e->begin,
                          (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                          atlas_dtype_name(e->dtype), (unsigned long long)count);
    return ATLAS_OK;
}

static atlas_status parse_entry(const char *file, const char *name, json_t *obj, st_entry *e) {
    if (!json_is_object(obj))
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': entry is not an object", file,
                          name);
    static const char *const keys[] = {"dtype", "shape", "data_offsets"};
    for (int k = 0; k < 3; k++)
        if (!json_object_get(obj, keys[k]))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: tensor '%s': missing \"%s\"", file, name,
                              keys[k]);
    e->name = name;
    ATLAS_TRY(parse_dtype(file, name, json_object_get(obj, "dtype"), &e->dtype));
    ATLAS_TRY(parse_shape(file, name, json_object_get(obj, "shape"), e));
    ATLAS_TRY(parse_offsets(file, name, json_object_get(obj, "data_offsets"), e));
    return check_size(file, e);
}

static int entry_cmp_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Range and overlap checks over one file's entries (sorted here by offset), and the format's
 * rule that they fill the data section exactly, from its first byte to its last, with no
 * gap (as the safetensors library checks it): a header length a few bytes short still
 * parses, its JSON padded with spaces, and would read every tensor shifted. */
static atlas_status check_layout(const char *file, st_entry *es, size_t n, uint64_t data_len) {
    qsort(es, n, sizeof *es, entry_cmp_begin);
    const st_entry *reach = NULL; /* the non-empty range seen so far that ends last */
    uint64_t filled = 0;          /* bytes [0, filled) are covered */
    for (size_t i = 0; i < n; i++) {
        const st_entry *e = &es[i];
        if (e->end > data_len)
            return atlas_fail(ATLAS_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets [%llu, %llu] out of range of the "
                              "data section (%llu bytes)", file, e->name,
                              (unsigned long long)e->begin, (unsigned long long)e->end,
                              (unsigned long long)data_len);
        if (e->begin == e->end) continue; /* empty: occupies no bytes */
        if (reach && e->begin < reach->end)
            return atlas_fail(ATLAS_ERR_FORMAT,
                              "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (bytes "
                              "%llu..%llu)", file, e->name, (unsigned long long)e->begin,
                              (unsigned long long)e->end, reach->name,
                              (unsigned long long)reach->begin, (unsigned long long)reach->end);
        if (e->begin != filled)
            return atlas_fail(ATLAS_ERR_FORMAT,
                              "%s: tensor '%s' begins at byte %llu of the data section, where "
                              "the tensors before it end at %llu (a gap: the header length or "
                              "the offsets are wrong)", file, e->name,
                              (unsigned long long)e->begin, (unsigned long long)filled);
        filled = e->end;
        if (!reach || e->end > reach->end) reach = e;
    }
    if (filled != data_len)
        return atlas_fail(ATLAS_ERR_FORMAT,
                          "%s: the tensors fill %llu bytes of the %llu-byte data section (the "
                          "header length or the offsets are wrong)", file,
                          (unsigned long long)filled, (unsigned long long)data_len);
    return ATLAS_OK;
}

static atlas_status push_tensor(atlas_st *st, const st_entry *e, const char *file,
                                const unsigned char *data) {
    if (st->n_tensors == st->cap_tensors) {
        size_t cap = st->cap_tensors ? st->cap_tensors * 2 : 64;
        atlas_tensor_view *t = realloc(st->tensors, cap * sizeof *t);
        if (!t) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory for tensor list", file);
        st->tensors = t;
        st->cap_tensors = cap;
    }
    char *name = strdup(e->name);
    if (!name) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", file);
    atlas_tensor_view *v = &st->tensors[st->n_tensors++];
    memset(v, 0, sizeof *v);
    v->name = name;
    v->file = file;
    v->dtype = e->dtype;
    v->n_dims = e->n_dims;
    memcpy(v->shape, e->shape, sizeof v->shape);
    v->data = data + e->begin;
    v->nbytes = (size_t)(e->end - e->begin);
    st->total_bytes += v->nbytes;
    return ATLAS_OK;
}

static atlas_status parse_json_header(const char *file, const unsigned char *buf, size_t n,
                                      json_t **out) {
    json_error_t err;
    *out = json_loadb((const char *)buf, n, JSON_REJECT_DUPLICATES, &err);
    if (*out) {
        if (json_is_object(*out)) return ATLAS_OK;
        json_decref(*out);
        *out = NULL;
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: header JSON (byte 8) is not an object", file);
    }
    return atlas_fail(ATLAS_ERR_FORMAT, "%s: header JSON: %s at byte %llu (line %d, column %d)",
                      file, err.text, (unsigned long long)err.position + 8, err.line,
                      err.column);
}

/* Validates the whole file held in buf[0..len) and appends its tensors to st. file must
 * outlive st (it is one of st->files' paths). */
static atlas_status parse_file(atlas_st *st, const char *file, const unsigned char *buf,
                               size_t len) {
    if (len < 8)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: truncated: %zu bytes, no 8-byte header length",
                          file, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n > len - 8)
        return atlas_fail(ATLAS_ERR_FORMAT,
                          "%s: header length %llu runs past the end of the file (%zu bytes)", file,
                          (unsigned long long)n, len);
    if (n > ST_MAX_HEADER)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit",
                          file, (unsigned long long)n);
    json_t *root;
    ATLAS_TRY(parse_json_header(file, buf + 8, (size_t)n, &root));
    size_t cap = json_object_size(root);
    st_entry *es = calloc(cap ? cap : 1, sizeof *es);
    if (!es) {
        json_decref(root);
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", file);
    }
    atlas_status s = ATLAS_OK;
    size_t count = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                s = atlas_fail(ATLAS_ERR_FORMAT, "%s: \"__metadata__\" is not an object", file);
                break;
            }
            continue;
        }
        s = parse_entry(file, key, val, &es[count]);
        if (s != ATLAS_OK) break;
        count++;
    }
    const unsigned char *data = buf + 8 + n;
    if (s == ATLAS_OK) s = check_layout(file, es, count, len - 8 - n);
    for (size_t i = 0; s == ATLAS_OK && i < count; i++) s = push_tensor(st, &es[i], file, data);
    free(es);
    json_decref(root);
    return s;
}

static int view_cmp_name(const void *a, const void *b) {
    const atlas_tensor_view *x = *(const atlas_tensor_view *const *)a;
    const atlas_tensor_view *y = *(const atlas_tensor_view *const *)b;
    return strcmp(x->name, y->name);
}

/* Builds the name index; a name held twice (across shards) is an error. */
static atlas_status build_index(atlas_st *st) {
    st->by_name = malloc((st->n_tensors ? st->n_tensors : 1) * sizeof *st->by_name);
    if (!st->by_name) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory for tensor index");
    for (size_t i = 0; i < st->n_tensors; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, st->n_tensors, sizeof *st->by_name, view_cmp_name);
    for (size_t i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->by_name[i]->name, st->by_name[i - 1]->name))
            return atlas_fail(ATLAS_ERR_FORMAT, "tensor '%s' is in both %s and %s",
                              st->by_name[i]->name, st->by_name[i - 1]->file,
                              st->by_name[i]->file);
    return ATLAS_OK;
}

static atlas_status st_new(size_t n_files, atlas_st **out) {
    atlas_st *st = calloc(1, sizeof *st);
    if (st) st->files = calloc(n_files ? n_files : 1, sizeof *st->files);
    if (!st || !st->files) {
        free(st);
        return atlas_fail(ATLAS_ERR_NOMEM, "out of memory opening safetensors");
    }
    *out = st;
    return ATLAS_OK;
}

/* Adds and maps one file (buf == NULL) or borrows buf. */
static atlas_status st_add_file(atlas_st *st, const char *path, const void *buf, size_t len) {
    st_file *f = &st->files[st->n_files];
    f->path = strdup(path);
    if (!f->path) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", path);
    st->n_files++;
    if (!buf) {
        ATLAS_TRY(atlas_file_map_open(path, &f->map));
        buf = f->map.data;
        len = f->map.size;
    }
    size_t first = st->n_tensors;
    ATLAS_TRY(parse_file(st, f->path, buf, len));
    for (size_t i = first; i < st->n_tensors; i++) {
        atlas_tensor_view *v = &st->tensors[i];
        v->fd = f->map.fd_open ? f->map.fd : -1;
        v->file_offset = (uint64_t)((const unsigned char *)v->data - (const unsigned char *)buf);
    }
    return ATLAS_OK;
}

atlas_status atlas_st_open_memory(const void *buf, size_t len, const char *name, atlas_st **out) {
    *out = NULL;
    atlas_st *st = NULL;
    ATLAS_TRY(st_new(1, &st));
    atlas_status s = st_add_file(st, name ? name : "<memory>", buf ? buf : "", buf ? len : 0);
    if (s == ATLAS_OK) s = build_index(st);
    if (s != ATLAS_OK) {
        atlas_st_free(st);
        return s;
    }
    *out = st;
    return ATLAS_OK;
}

atlas_status atlas_st_open_file(const char *path, atlas_st **out) {
    *out = NULL;
    atlas_st *st = NULL;
    ATLAS_TRY(st_new(1, &st));
    atlas_status s = st_add_file(st, path, NULL, 0);
    if (s == ATLAS_OK) s = build_index(st);
    if (s != ATLAS_OK) {
        atlas_st_free(st);
        return s;
    }
    *out = st;
    return ATLAS_OK;
}

/* A shard name from the index must be a plain file name inside the directory. */
static bool shard_name_ok(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Collects the distinct shard names of weight_map (in first-seen order) into names. */
static atlas_status index_shards(const char *ipath, json_t *wm, const char ***names,
                                 size_t *n) {
    size_t cap = json_object_size(wm);
    *names = calloc(cap ? cap : 1, sizeof **names);
    *n = 0;
    if (!*names) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", ipath);
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val))
            return atlas_fail(ATLAS_ERR_FORMAT, "%s: weight_map.\"%s\" is not a string", ipath,
                              key);
        const char *s = json_string_value(val);
        if (!shard_name_ok(s))
            return atlas_fail(ATLAS_ERR_FORMAT,
                              "%s: weight_map.\"%s\": shard \"%s\" is not a file name in the "
                              "directory", ipath, key, s);
        size_t i = 0;
        while (i < *n && strcmp((*names)[i], s) != 0) i++;
        if (i == *n) (*names)[(*n)++] = s;
    }
    if (*n == 0) return atlas_fail(ATLAS_ERR_FORMAT, "%s: weight_map is empty", ipath);
    return ATLAS_OK;
}

/* Every tensor the index names must be in the shard it names. */
static atlas_status index_check(const atlas_st *st, const char *ipath, const char *dir,
                                json_t *wm) {
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const atlas_tensor_view *t = atlas_st_find(st, key);
        const char *shard = json_string_value(val);
        if (!t)
            return atlas_fail(ATLAS_ERR_NOT_FOUND,
                              "%s: tensor '%s' is indexed in %s/%s but no shard holds it", ipath,
                              key, dir, shard);
        size_t dl = strlen(dir);
        const char *base = t->file;
        if (!strncmp(base, dir, dl) && base[dl] == '/') base += dl + 1;
        if (strcmp(base, shard) != 0)
            return atlas_fail(ATLAS_ERR_NOT_FOUND,
                              "%s: tensor '%s' is indexed in %s/%s but is in %s", ipath, key, dir,
                              shard, t->file);
    }
    return ATLAS_OK;
}

static atlas_status open_index(const char *dir, const char *ipath, atlas_st **out) {
    char *text;
    size_t len;
    ATLAS_TRY(atlas_file_read(ipath, &text, &len));
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root)
        return atlas_fail(ATLAS_ERR_FORMAT, "%s: JSON: %s at byte %d (line %d, column %d)",
                          ipath, err.text, err.position, err.line, err.column);
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    const char **names = NULL;
    size_t n_names = 0;
    atlas_st *st = NULL;
    atlas_status s;
    if (!json_is_object(wm))
        s = atlas_fail(ATLAS_ERR_FORMAT, "%s: \"weight_map\" is missing or not an object",
                       ipath);
    else
        s = index_shards(ipath, wm, &names, &n_names);
    if (s == ATLAS_OK) s = st_new(n_names, &st);
    for (size_t i = 0; s == ATLAS_OK && i < n_names; i++) {
        char path[4096];
        s = atlas_path_join(path, sizeof path, dir, names[i]);
        if (s == ATLAS_OK) s = st_add_file(st, path, NULL, 0);
    }
    if (s == ATLAS_OK) s = build_index(st);
    if (s == ATLAS_OK) s = index_check(st, ipath, dir, wm);
    free(names);
    json_decref(root);
    if (s != ATLAS_OK) {
        atlas_st_free(st);
        return s;
    }
    *out = st;
    return ATLAS_OK;
}

atlas_status atlas_st_open_dir(const char *dir, atlas_st **out) {
    *out = NULL;
    char path[4096];
    /* model.safetensors first where both are there, as transformers loads them (a folder
     * may keep an old index beside a merged file) */
    ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "model.safetensors"));
    if (atlas_file_exists(path)) return atlas_st_open_file(path, out);
    ATLAS_TRY(atlas_path_join(path, sizeof path, dir, "model.safetensors.index.json"));
    if (!atlas_file_exists(path))
        return atlas_fail(ATLAS_ERR_NOT_FOUND,
                          "%s: no model.safetensors or model.safetensors.index.json", dir);
    return open_index(dir, path, out);
}

size_t atlas_st_count(const atlas_st *st) { return st ? st->n_tensors : 0; }

const atlas_tensor_view *atlas_st_at(const atlas_st *st, size_t i) {
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

size_t atlas_st_index(const atlas_st *st, const atlas_tensor_view *v) {
    if (!st) return 0;
    /* compared as addresses: v may point anywhere */
    uintptr_t a = (uintptr_t)v, first = (uintptr_t)st->tensors;
    if (!v || a < first || a >= first + st->n_tensors * sizeof *st->tensors) return st->n_tensors;
    return (a - first) / sizeof *st->tensors;
}

const atlas_tensor_view *atlas_st_find(const atlas_st *st, const char *name) {
    if (!st || !st->by_name) return NULL;
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->by_name[mid]->name);
        if (c == 0) return st->by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t atlas_st_total_bytes(const atlas_st *st) { return st ? st->total_bytes : 0; }

void atlas_st_free(atlas_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_files; i++) {
        atlas_file_map_close(&st->files[i].map);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->by_name);
    free(st->files);
    free(st);
}
