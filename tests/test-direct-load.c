/* tests/test-direct-load.c — the direct weight loader (backend/cuda/direct.c) through a fake
 * driver (CI has no GPU): "device" addresses are host memory, copies are memcpy.  The fake
 * checks what the real driver would refuse or silently slow down: a registration that is not
 * read-only, not page aligned or overlaps a live one; a copy whose source is not inside one
 * live registration (or a staging buffer); an unregistration of something not registered.
 * Checked: the bytes land, odd offsets and ranges across pieces, a small window, the mixed
 * mode, dropped copies, a failing copy (nothing left registered), and a refused registration
 * (the rest staged, direct loading off for the process).  With kernels in the binary, the
 * CUDA backend's weight_load too (kernels are never launched): a fused weight of bf16, f32
 * and f16 views lands converted at its offsets by both ATLAS_LOAD paths, a weight freed
 * before weights_done is never written.  tests/test-gpu-forward.c loads the fixtures both
 * ways on a real GPU. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/direct.h"
#include "core/dtype.h"
#include "core/file.h"
#include "harness.h"
#include "format/safetensors.h"

/* --- the fake driver ---------------------------------------------------------------------- */

enum { MAX_REGS = 256, NOT_SUPPORTED = 801 };

static struct {
    pthread_mutex_t mu;
    struct { uintptr_t a, b; } regs[MAX_REGS]; /* live registrations */
    struct { uintptr_t a, b; } hosts[16];      /* cuMemHostAlloc buffers */
    int n_hosts;
    int registered_total, live, max_live;
    int bad_register, bad_copy, bad_unregister;
    int fail_register_after; /* > 0: registrations after this many fail (NOT_SUPPORTED) */
    int fail_copy_at;        /* > 0: the n-th copy fails */
    int copies;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local CUcontext fk_current;
static char fk_ctx, fk_stream, fk_event;
static size_t page;

static CUresult f_ok(void) { return 0; }
static CUresult f_init(unsigned int flags) { (void)flags; return 0; }
static CUresult f_version(int *v) { *v = 13000; return 0; }
static CUresult f_err_name(CUresult e, const char **name) {
    *name = e == NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED" : e == 700 ? "CUDA_ERROR_ILLEGAL_ADDRESS"
                                                                      : "CUDA_ERROR_FAKE";
    return 0;
}
static CUresult f_err_string(CUresult e, const char **text) {
    (void)e;
    *text = "fake error";
    return 0;
}
static CUresult f_dev_get(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
static CUresult f_dev_count(int *n) { *n = 1; return 0; }
static CUresult f_dev_name(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return 0;
}
static CUresult f_dev_attr(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    *v = a == ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MAJOR ? 9 : a == ATLAS_CU_ATTR_MULTIPROCESSOR_COUNT ? 132 : 0;
    return 0;
}
static CUresult f_total_mem(size_t *b, CUdevice d) { (void)d; *b = (size_t)80 << 30; return 0; }
static CUresult f_retain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&fk_ctx; return 0; }
static CUresult f_release(CUdevice d) { (void)d; return 0; }
static CUresult f_set_current(CUcontext c) { fk_current = c; return 0; }
static CUresult f_get_current(CUcontext *c) { *c = fk_current; return 0; }
static CUresult f_stream_create(CUstream *s, unsigned int flags) {
    (void)flags;
    *s = (CUstream)&fk_stream;
    return 0;
}
static CUresult f_stream(CUstream s) { (void)s; return 0; }
static CUresult f_event_create(CUevent *e, unsigned int flags) {
    (void)flags;
    *e = (CUevent)&fk_event;
    return 0;
}
static CUresult f_event_record(CUevent e, CUstream s) { (void)e, (void)s; return 0; }
static CUresult f_event(CUevent e) { (void)e; return 0; }

static CUresult f_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    uintptr_t a = (uintptr_t)src, b = a + n;
    pthread_mutex_lock(&fk.mu);
    int inside = 0;
    for (int i = 0; i < MAX_REGS; i++)
        inside |= fk.regs[i].b && fk.regs[i].a <= a && b <= fk.regs[i].b;
    for (int i = 0; i < fk.n_hosts; i++) inside |= fk.hosts[i].a <= a && b <= fk.hosts[i].b;
    fk.bad_copy += !inside;
    int fail = fk.fail_copy_at > 0 && ++fk.copies == fk.fail_copy_at;
    pthread_mutex_unlock(&fk.mu);
    if (fail) return 700;
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static CUresult f_host_alloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    *p = malloc(bytes);
    pthread_mutex_lock(&fk.mu);
    if (*p && fk.n_hosts < 16)
        fk.hosts[fk.n_hosts].a = (uintptr_t)*p, fk.hosts[fk.n_hosts++].b = (uintptr_t)*p + bytes;
    pthread_mutex_unlock(&fk.mu);
    return *p ? 0 : 2;
}
static CUresult f_free_host(void *p) { free(p); return 0; }

static CUresult f_register(void *p, size_t bytes, unsigned int flags) {
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    CUresult res = 0;
    pthread_mutex_lock(&fk.mu);
    if (fk.fail_register_after > 0 && fk.registered_total >= fk.fail_register_after) {
        res = NOT_SUPPORTED;
    } else if (flags != ATLAS_CU_MEMHOSTREGISTER_READ_ONLY || a % page || bytes % page ||
               bytes == 0) {
        fk.bad_register++;
        res = 1;
    } else {
        int slot = -1;
        for (int i = 0; i < MAX_REGS; i++) {
            if (fk.regs[i].b && a < fk.regs[i].b && fk.regs[i].a < b) res = 712; /* overlap */
            if (!fk.regs[i].b && slot < 0) slot = i;
        }
        if (res || slot < 0) {
            fk.bad_register++;
            res = res ? res : 2;
        } else {
            fk.regs[slot].a = a, fk.regs[slot].b = b;
            fk.registered_total++;
            if (++fk.live > fk.max_live) fk.max_live = fk.live;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return res;
}
static CUresult f_unregister(void *p) {
    pthread_mutex_lock(&fk.mu);
    int found = 0;
    for (int i = 0; i < MAX_REGS && !found; i++)
        if (fk.regs[i].b && fk.regs[i].a == (uintptr_t)p) {
            fk.regs[i].a = fk.regs[i].b = 0;
            fk.live--;
            found = 1;
        }
    fk.bad_unregister += !found;
    pthread_mutex_unlock(&fk.mu);
    return found ? 0 : 1;
}

static char fk_module, fk_function;
static CUresult f_module_load(CUmodule *m, const void *image) {
    (void)image;
    *m = (CUmodule)&fk_module;
    return 0;
}
static CUresult f_module_unload(CUmodule m) { (void)m; return 0; }
static CUresult f_get_function(CUfunction *fn, CUmodule m, const char *name) {
    (void)m, (void)name;
    *fn = (CUfunction)&fk_function;
    return 0;
}
static CUresult f_alloc(CUdeviceptr *p, size_t bytes) {
    void *q = NULL;
    if (posix_memalign(&q, 256, bytes ? bytes : 1)) return 2;
    *p = (CUdeviceptr)(uintptr_t)q;
    return 0;
}
static CUresult f_free(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static CUresult f_memset8(CUdeviceptr dst, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)dst, v, n);
    return 0;
}

static void install_fake(void) {
    atlas_driver d;
    memset(&d, 0, sizeof d);
    d.cuInit = f_init;
    d.cuDriverGetVersion = f_version;
    d.cuGetErrorName = f_err_name;
    d.cuGetErrorString = f_err_string;
    d.cuDeviceGet = f_dev_get;
    d.cuDeviceGetCount = f_dev_count;
    d.cuDeviceGetName = f_dev_name;
    d.cuDeviceGetAttribute = f_dev_attr;
    d.cuDeviceTotalMem = f_total_mem;
    d.cuDevicePrimaryCtxRetain = f_retain;
    d.cuDevicePrimaryCtxRelease = f_release;
    d.cuCtxSetCurrent = f_set_current;
    d.cuCtxGetCurrent = f_get_current;
    d.cuCtxSynchronize = (CUresult (*)(void))f_ok;
    d.cuStreamCreate = f_stream_create;
    d.cuStreamDestroy = f_stream;
    d.cuStreamSynchronize = f_stream;
    d.cuEventCreate = f_event_create;
    d.cuEventRecord = f_event_record;
    d.cuEventSynchronize = f_event;
    d.cuEventQuery = f_event;
    d.cuEventDestroy = f_event;
    d.cuMemcpyHtoDAsync = f_htod_async;
    d.cuMemHostAlloc = f_host_alloc;
    d.cuMemFreeHost = f_free_host;
    d.cuMemHostRegister = f_register;
    d.cuMemHostUnregister = f_unregister;
    d.cuModuleLoadData = f_module_load;
    d.cuModuleUnload = f_module_unload;
    d.cuModuleGetFunction = f_get_function;
    d.cuMemAlloc = f_alloc;
    d.cuMemFree = f_free;
    d.cuMemcpyHtoD = f_htod;
    d.cuMemsetD8 = f_memset8;
    CHECK_OK(atlas_driver_install_for_test(&d, 13000));
}

/* --- the files and the copies -------------------------------------------------------------- */

enum { N_FILES = 2, MAX_COPIES = 32 };

typedef struct copy {
    int file;
    size_t off, bytes;
    unsigned char *dst; /* the "device" buffer */
} copy;

static atlas_file_map maps[N_FILES];
static char paths[N_FILES][600];
static copy copies[MAX_COPIES];
static int n_copies;
static size_t staged_by_fn;

/* Files of random bytes, sizes not page multiples. */
static void make_files(const char *dir) {
    for (int f = 0; f < N_FILES; f++) {
        snprintf(paths[f], sizeof paths[f], "%s/shard%d.bin", dir, f);
        size_t size = (f ? 3 : 5) * ((size_t)1 << 20) + 12345 * (f + 1);
        unsigned char *buf = malloc(size);
        uint32_t x = 2463534242u + (uint32_t)f;
        for (size_t i = 0; i < size; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            buf[i] = (unsigned char)x;
        }
        FILE *fp = fopen(paths[f], "wb");
        CHECK(fp && fwrite(buf, 1, size, fp) == size);
        if (fp) fclose(fp);
        free(buf);
        CHECK_OK(atlas_file_map_open(paths[f], &maps[f]));
    }
}

static void add_copy(atlas_direct *d, int file, size_t off, size_t bytes) {
    copy *c = &copies[n_copies++];
    c->file = file, c->off = off, c->bytes = bytes;
    c->dst = calloc(1, bytes);
    CHECK(atlas_direct_eligible(maps[file].data + off, maps[file].fd, off));
    CHECK_OK(atlas_direct_add(d, (CUdeviceptr)(uintptr_t)c->dst, maps[file].data + off,
                              maps[file].fd, off, bytes));
}

/* A spread of copies: odd offsets and sizes, several pieces long, overlapping sources (a
 * tensor loaded twice), tiny ones, both files, added out of file order. */
static void add_copies(atlas_direct *d) {
    add_copy(d, 1, 1000001, 777777);
    add_copy(d, 0, 3, 1);
    add_copy(d, 0, 8, 2 * ((size_t)1 << 20) + 5);
    add_copy(d, 0, 4096 * 3 + 17, 4096);
    add_copy(d, 1, 0, 4096);
    add_copy(d, 0, 5 * ((size_t)1 << 20), 12345); /* the file's unaligned tail */
    add_copy(d, 0, 2 * ((size_t)1 << 20) + 13, 999999);
    add_copy(d, 1, 1000001, 777777);              /* the same source again */
    add_copy(d, 1, 3 * ((size_t)1 << 20) + 24000, 690);
}

static int check_copies(const char *what) {
    int bad = 0;
    for (int i = 0; i < n_copies; i++) {
        const copy *c = &copies[i];
        if (c->dst && memcmp(c->dst, maps[c->file].data + c->off, c->bytes) != 0) bad++;
    }
    CHECK_MSG(bad == 0, "%s: %d of %d copies differ from the file", what, bad, n_copies);
    return bad;
}

static void free_copies(void) {
    for (int i = 0; i < n_copies; i++) free(copies[i].dst);
    n_copies = 0;
}

static atlas_status stage_fn(void *user, CUdeviceptr dst, const char *src, int fd,
                             uint64_t file_off, size_t bytes) {
    (void)user;
    CHECK(fd >= 0);
    CHECK(atlas_file_read_at(fd, (void *)(uintptr_t)dst, bytes, file_off) == ATLAS_OK);
    CHECK(memcmp((void *)(uintptr_t)dst, src, bytes) == 0); /* src is the same bytes */
    staged_by_fn += bytes;
    return ATLAS_OK;
}

static void check_clean(const char *what) {
    CHECK_MSG(fk.live == 0, "%s: %d pieces still registered", what, fk.live);
    CHECK_MSG(fk.bad_register == 0, "%s: %d bad registrations", what, fk.bad_register);
    CHECK_MSG(fk.bad_copy == 0, "%s: %d copies not out of one registration", what, fk.bad_copy);
    CHECK_MSG(fk.bad_unregister == 0, "%s: %d bad unregistrations", what, fk.bad_unregister);
}

static atlas_direct *make(atlas_host *h, size_t piece, int threads, int window, int pct) {
    atlas_direct_opts o = {piece, threads, window, pct};
    atlas_direct *d = NULL;
    CHECK_OK(atlas_direct_create(h, &o, stage_fn, NULL, &d));
    return d;
}

static size_t total_bytes(void) {
    size_t n = 0;
    for (int i = 0; i < n_copies; i++) n += copies[i].bytes;
    return n;
}

/* --- the CUDA backend's weight_load ------------------------------------------------------- */
#ifdef ATLAS_HAVE_KERNELS

/* A checkpoint of mixed dtypes: a[4, 8] bf16, b[2, 8] f32, c[3, 8] bf16, n[8] bf16, m[8] f16,
 * big[16384, 64] bf16 (2 MiB: several 1 MiB pieces), after a header of odd length. */
static void write_checkpoint(const char *path) {
    const char *hdr = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,8],\"data_offsets\":[64,128]},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[3,8],\"data_offsets\":[128,176]},"
                      "\"n\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[176,192]},"
                      "\"m\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[192,208]},"
                      "\"big\":{\"dtype\":\"BF16\",\"shape\":[16384,64],"
                      "\"data_offsets\":[208,2097360]}} "; /* 363 bytes: data at an odd offset */
    uint64_t hn = strlen(hdr);
    size_t data = 2097360;
    unsigned char *buf = malloc(data);
    uint32_t x = 12345;
    for (size_t i = 0; i < data; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
    for (int i = 0; i < 16; i++) { /* b: finite floats; m: finite halves */
        float f = (float)i * 0.37f - 2.0f;
        memcpy(buf + 64 + 4 * i, &f, 4);
    }
    for (int i = 0; i < 8; i++) {
        uint16_t h = (uint16_t)(0x3c00 + i * 0x111);
        memcpy(buf + 192 + 2 * i, &h, 2);
    }
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(&hn, 8, 1, fp) == 1 && fwrite(hdr, 1, hn, fp) == hn &&
          fwrite(buf, 1, data, fp) == data);
    if (fp) fclose(fp);
    free(buf);
}

/* The bf16 bytes a view should become on the device, appended at out. */
static size_t expect_view(const atlas_tensor_view *v, unsigned char *out) {
    size_t ne = v->nbytes / atlas_dtype_size(v->dtype);
    for (size_t i = 0; i < ne; i++) {
        uint16_t b;
        if (v->dtype == ATLAS_DTYPE_BF16) {
            memcpy(&b, (const char *)v->data + 2 * i, 2);
        } else if (v->dtype == ATLAS_DTYPE_F16) {
            uint16_t h;
            memcpy(&h, (const char *)v->data + 2 * i, 2);
            b = atlas_f32_to_bf16(atlas_f16_to_f32(h));
        } else {
            float f;
            memcpy(&f, (const char *)v->data + 4 * i, 4);
            b = atlas_f32_to_bf16(f);
        }
        memcpy(out + 2 * i, &b, 2);
    }
    return 2 * ne;
}

static int weight_is(const atlas_weight *w, const atlas_tensor_view *const *v, int n) {
    unsigned char *want = malloc((size_t)w->rows * w->cols * 2);
    size_t off = 0;
    for (int i = 0; i < n; i++) off += expect_view(v[i], want + off);
    int same = off == (size_t)w->rows * w->cols * 2 &&
               !memcmp((void *)(uintptr_t)w->ptr, want, off);
    free(want);
    return same;
}

static void test_backend(const char *dir, const char *mode) {
    char path[600];
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    write_checkpoint(path);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    setenv("ATLAS_LOAD", mode, 1);
    setenv("ATLAS_LOAD_PIECE_MB", "1", 1);
    setenv("ATLAS_LOAD_STAGE_PCT", "50", 1);
    setenv("ATLAS_CUBLASLT", "0", 1);
    setenv("ATLAS_CUDA_PDL", "0", 1);
    double inv_freq[4] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = 8, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 8, .vocab_size = 4, .n_layers = 1, .rms_eps = 1e-5f,
                            .rope_inv_freq = inv_freq, .rope_attn_factor = 1};
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cuda_create(&g, &be));
    if (!st || !be) goto out;
    const atlas_tensor_view *a = atlas_st_find(st, "a"), *b = atlas_st_find(st, "b"),
                            *c = atlas_st_find(st, "c"), *n = atlas_st_find(st, "n"),
                            *m = atlas_st_find(st, "m"), *big = atlas_st_find(st, "big");
    const atlas_tensor_view *abc[] = {a, b, c}, *nm[] = {n, m}, *cc[] = {c}, *bg[] = {big};
    atlas_weight *w_abc = NULL, *w_nm = NULL, *w_c = NULL, *w_big = NULL;
    CHECK_OK(be->ops->weight_load(be, abc, 3, &w_abc));
    CHECK_OK(be->ops->weight_load(be, nm, 2, &w_nm));
    CHECK_OK(be->ops->weight_load(be, cc, 1, &w_c));
    CHECK_OK(be->ops->weight_load(be, bg, 1, &w_big));
    if (!w_abc || !w_nm || !w_c || !w_big) goto out;
    /* freed before its copy ran: never written (ASan would see a write into freed memory) */
    be->ops->weight_free(be, w_c);
    int regs = fk.registered_total;
    CHECK_OK(be->ops->weights_done(be));
    CHECK_MSG(weight_is(w_abc, abc, 3), "%s: fused bf16|f32|bf16 weight differs", mode);
    CHECK_MSG(weight_is(w_nm, nm, 2), "%s: fused bf16|f16 1-D weight differs", mode);
    CHECK_MSG(weight_is(w_big, bg, 1), "%s: big weight differs", mode);
    check_clean(mode);
    const cuda_load *ld = &((cuda_backend *)be)->load;
    size_t direct = a->nbytes + c->nbytes + n->nbytes + big->nbytes; /* w_c's copy: dropped */
    size_t staged = 2 * (b->nbytes / 4) + m->nbytes;
    if (!strcmp(mode, "stage")) {
        CHECK(ld->runs.direct_bytes == 0 && ld->runs.pieces == 0 && fk.registered_total == regs);
        CHECK(ld->staged_bytes == direct + staged + c->nbytes);
    } else {
        int mix = !strcmp(mode, "mix"); /* 1 of the 3 pieces staged (ATLAS_LOAD_STAGE_PCT 50) */
        CHECK_MSG(ld->runs.direct_bytes + ld->runs.staged_bytes == direct &&
                  ld->staged_bytes == staged, "%s: direct %zu + %zu (want %zu), staged %zu "
                  "(want %zu)", mode, ld->runs.direct_bytes, ld->runs.staged_bytes, direct,
                  ld->staged_bytes, staged);
        CHECK_MSG(ld->runs.pieces == 3 && ld->runs.pieces_staged == mix &&
                  fk.registered_total - regs == 3 - mix, "%d pieces (%d staged), %d "
                  "registrations", ld->runs.pieces, ld->runs.pieces_staged,
                  fk.registered_total - regs);
        CHECK(mix ? ld->runs.staged_bytes > 0 : ld->runs.staged_bytes == 0);
    }
    printf("backend, ATLAS_LOAD=%s: %zu bytes direct in %d pieces (%d staged: %zu bytes), %zu "
           "staged by weight_load\n", mode, ld->runs.direct_bytes, ld->runs.pieces,
           ld->runs.pieces_staged, ld->runs.staged_bytes, ld->staged_bytes);
    be->ops->weight_free(be, w_abc);
    be->ops->weight_free(be, w_nm);
    be->ops->weight_free(be, w_big);
out:
    if (be) be->ops->destroy(be);
    atlas_st_free(st);
    unsetenv("ATLAS_LOAD");
    unsetenv("ATLAS_LOAD_PIECE_MB");
}
#else
static void test_backend(const char *dir, const char *mode) {
    (void)dir, (void)mode;
    printf("backend: skipped (built without kernels: no CUDA backend to create)\n");
}
#endif

int main(void) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    install_fake();
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    char dir[512];
    CHECK(harness_mkdtemp(dir, sizeof dir, "direct"));
    make_files(dir);
    if (!h || harness_failures) return harness_finish();

    /* never eligible: no descriptor, or a mapping that does not start on a page */
    CHECK(!atlas_direct_eligible(maps[0].data + 8, -1, 8));
    CHECK(!atlas_direct_eligible(maps[0].data + 8, maps[0].fd, 7));
    CHECK(atlas_direct_eligible(maps[0].data + 8, maps[0].fd, 8));

    /* pieces of 64 KiB (many), 8 threads (2 reapers), a window of 3: every copy lands, all
     * out of one registration each, at most 3 registered at once, none left */
    atlas_direct *d = make(h, 64 << 10, 8, 3, 0);
    add_copies(d);
    CHECK(atlas_direct_queued_bytes(d) == total_bytes());
    atlas_direct_stats s;
    CHECK_OK(atlas_direct_run(d, &s));
    check_copies("direct");
    check_clean("direct");
    CHECK_MSG(fk.max_live <= 3, "%d registered at once (window 3)", fk.max_live);
    CHECK(s.direct_bytes == total_bytes() && s.staged_bytes == 0 && s.pieces_staged == 0);
    CHECK_MSG(s.pieces >= 60 && fk.registered_total == s.pieces, "%d pieces, %d registered",
              s.pieces, fk.registered_total);
    CHECK(atlas_direct_queued_bytes(d) == 0);
    printf("direct: %d pieces, %zu bytes, at most %d registered\n", s.pieces, s.direct_bytes,
           fk.max_live);
    free_copies();

    /* an unaligned piece size is rounded to pages; one piece a file */
    atlas_direct_free(d);
    d = make(h, (size_t)64 << 20 | 1, 2, 0, 0);
    add_copies(d);
    CHECK_OK(atlas_direct_run(d, &s));
    check_copies("big pieces");
    check_clean("big pieces");
    CHECK_MSG(s.pieces == 2 && s.piece_bytes % page == 0, "%d pieces of %zu bytes", s.pieces,
              s.piece_bytes);
    free_copies();
    atlas_direct_free(d);

    /* mixed: half the pieces staged (by stage_fn), the rest registered */
    d = make(h, 256 << 10, 3, 0, 50);
    add_copies(d);
    staged_by_fn = 0;
    CHECK_OK(atlas_direct_run(d, &s));
    check_copies("mix");
    check_clean("mix");
    CHECK(s.staged_bytes == staged_by_fn && s.staged_bytes + s.direct_bytes == total_bytes());
    CHECK_MSG(s.pieces_staged == s.pieces / 2 && s.direct_bytes > 0, "%d of %d pieces staged",
              s.pieces_staged, s.pieces);
    free_copies();

    /* dropped copies (a weight freed before the run) are not made */
    add_copies(d);
    copy *dropped = &copies[2];
    CUdeviceptr lo = (CUdeviceptr)(uintptr_t)dropped->dst;
    atlas_direct_drop(d, lo, lo + dropped->bytes);
    CHECK(atlas_direct_queued_bytes(d) == total_bytes() - dropped->bytes);
    CHECK_OK(atlas_direct_run(d, NULL));
    unsigned char *zero = calloc(1, dropped->bytes);
    CHECK(memcmp(dropped->dst, zero, dropped->bytes) == 0);
    free(zero);
    free(dropped->dst);
    dropped->dst = NULL;
    check_copies("drop");
    check_clean("drop");
    free_copies();
    atlas_direct_free(d);

    /* a copy fails: the error names the piece, nothing stays registered, the queue is empty */
    d = make(h, 64 << 10, 4, 6, 0);
    add_copies(d);
    fk.copies = 0;
    fk.fail_copy_at = 20;
    atlas_status st = atlas_direct_run(d, &s);
    CHECK(st == ATLAS_ERR_DEVICE);
    CHECK_MSG(strstr(atlas_last_error(), "direct load: copying piece") &&
              strstr(atlas_last_error(), "cuMemcpyHtoDAsync"), "%s", atlas_last_error());
    check_clean("failed copy");
    CHECK(atlas_direct_queued_bytes(d) == 0);
    fk.fail_copy_at = 0;
    free_copies();
    atlas_direct_free(d);
    atlas_direct_free(NULL);

    test_backend(dir, "direct");
    test_backend(dir, "stage");
    test_backend(dir, "mix");

    /* the driver refuses registration after 5: those land staged, direct loading is off for
     * the process, and says why */
    CHECK(strcmp(atlas_direct_refused(), "") == 0);
    d = make(h, 64 << 10, 4, 0, 0);
    add_copies(d);
    fk.fail_register_after = fk.registered_total + 5;
    staged_by_fn = 0;
    CHECK_OK(atlas_direct_run(d, &s));
    check_copies("refused");
    check_clean("refused");
    CHECK_MSG(s.direct_bytes > 0 && s.staged_bytes > 0 && s.staged_bytes == staged_by_fn &&
              s.direct_bytes + s.staged_bytes == total_bytes(), "direct %zu, staged %zu",
              s.direct_bytes, s.staged_bytes);
    CHECK_MSG(strstr(atlas_direct_refused(), "CUDA_ERROR_NOT_SUPPORTED") != NULL, "%s",
              atlas_direct_refused());
    CHECK(!atlas_direct_eligible(maps[0].data, maps[0].fd, 0));
    printf("refused: %s\n", atlas_direct_refused());
    free_copies();
    atlas_direct_free(d);

    fk.fail_register_after = 0;
    for (int f = 0; f < N_FILES; f++) atlas_file_map_close(&maps[f]);
    harness_rm_rf(dir);
    return harness_finish();
}
