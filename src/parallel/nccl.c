/* parallel/nccl.c — NCCL loaded with dlopen; see nccl.h. No globals: each atlas_nccl holds
 * its own table (the dlopen handle is shared by the dynamic loader's reference count). */
#include "parallel/nccl.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct atlas_nccl {
    atlas_nccl_fns fn;
    int version;
    atomic_int live_comms; /* ranks init and destroy from their own threads */
    char path[256];
    char env_note[128];
};

struct atlas_nccl_comm {
    atlas_nccl *nccl;
    ncclComm_t comm;
    int world, rank;
};

typedef struct nccl_symbol {
    const char *name;
    size_t offset;
    int optional;
} nccl_symbol;

#define SYM(f) {#f, offsetof(atlas_nccl_fns, f), 0}
static const nccl_symbol nccl_symbols[] = {
    SYM(ncclGetVersion), SYM(ncclGetUniqueId), SYM(ncclCommInitRank), SYM(ncclCommDestroy),
    SYM(ncclCommCount), SYM(ncclCommUserRank), SYM(ncclAllReduce), SYM(ncclGroupStart),
    SYM(ncclGroupEnd), SYM(ncclGetErrorString),
    {"ncclGetLastError", offsetof(atlas_nccl_fns, ncclGetLastError), 1},
};
#undef SYM
enum { N_SYMBOLS = (int)(sizeof nccl_symbols / sizeof nccl_symbols[0]) };

/* ncclResult_t names (nccl.h); the text comes from ncclGetErrorString. */
static const char *result_name(ncclResult_t r) {
    static const char *const names[] = {
        "ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
        "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};
    return r >= 0 && r < (int)(sizeof names / sizeof names[0]) ? names[r] : "ncclResult?";
}

/* The error of a failed NCCL call: its name, NCCL's text and, when NCCL has one, its last
 * error message (which says what went wrong underneath, e.g. the CUDA failure). */
static atlas_status nccl_fail(const atlas_nccl *n, ncclComm_t comm, const char *call,
                              ncclResult_t r, int line) {
    const char *text = n->fn.ncclGetErrorString ? n->fn.ncclGetErrorString(r) : NULL;
    const char *last = n->fn.ncclGetLastError ? n->fn.ncclGetLastError(comm) : NULL;
    return atlas_fail(ATLAS_ERR_DEVICE, "%s failed: %s (%s)%s%s (nccl.c:%d)", call,
                      result_name(r), text ? text : "?", last && *last ? ": " : "",
                      last && *last ? last : "", line);
}

#define NCCL_CALL(n, comm, f, ...)                                                         \
    do {                                                                                   \
        ncclResult_t nccl_r_ = (n)->fn.f(__VA_ARGS__);                                     \
        if (nccl_r_ != ATLAS_NCCL_SUCCESS) return nccl_fail((n), (comm), #f, nccl_r_, __LINE__); \
    } while (0)

/* NVLink multicast stays off (see nccl.h): before NCCL reads its environment. */
static void nvls_off(atlas_nccl *n) {
    const char *v = getenv("NCCL_NVLS_ENABLE");
    if (v && strcmp(v, "0") == 0) return;
    if (v)
        snprintf(n->env_note, sizeof n->env_note, "NCCL_NVLS_ENABLE was \"%.32s\": set to 0 "
                 "(NVLink multicast stays off)", v);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
}

static atlas_status check_version(atlas_nccl *n) {
    NCCL_CALL(n, NULL, ncclGetVersion, &n->version);
    if (n->version < ATLAS_NCCL_MIN_VERSION)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "NCCL %s: version code %d, atlas needs 2.10 "
                          "(%d) or later (ncclBfloat16)", n->path[0] ? n->path : "(table)",
                          n->version, ATLAS_NCCL_MIN_VERSION);
    return ATLAS_OK;
}

atlas_status atlas_nccl_open_table(const atlas_nccl_fns *fns, atlas_nccl **out) {
    *out = NULL;
    for (int i = 0; i < N_SYMBOLS; i++) {
        void *const *slot = (void *const *)((const char *)fns + nccl_symbols[i].offset);
        if (!*slot && !nccl_symbols[i].optional)
            return atlas_fail(ATLAS_ERR_INVALID, "NCCL table: %s is not set", nccl_symbols[i].name);
    }
    atlas_nccl *n = calloc(1, sizeof *n);
    if (!n) return atlas_fail(ATLAS_ERR_NOMEM, "NCCL table: out of memory");
    n->fn = *fns;
    nvls_off(n);
    atlas_status st = check_version(n);
    if (st != ATLAS_OK) {
        free(n);
        return st;
    }
    *out = n;
    return ATLAS_OK;
}

atlas_status atlas_nccl_open(const char *path, atlas_nccl **out) {
    *out = NULL;
    if (!path) path = getenv("ATLAS_LIBNCCL");
    if (!path || !*path) path = "libnccl.so.2";
    atlas_nccl *n = calloc(1, sizeof *n);
    if (!n) return atlas_fail(ATLAS_ERR_NOMEM, "NCCL: out of memory");
    snprintf(n->path, sizeof n->path, "%s", path);
    nvls_off(n); /* before the library's constructors and first calls */
    dlerror();
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        free(n);
        return atlas_fail(ATLAS_ERR_NO_DEVICE, "NCCL not available (tensor parallelism needs "
                          "it): dlopen: %s", why ? why : path);
    }
    for (int i = 0; i < N_SYMBOLS; i++) {
        void *f = dlsym(dl, nccl_symbols[i].name);
        if (!f && !nccl_symbols[i].optional) {
            atlas_status st = atlas_fail(ATLAS_ERR_UNSUPPORTED, "NCCL %s: no symbol %s: not an "
                                         "NCCL library, or too old", path, nccl_symbols[i].name);
            dlclose(dl); /* no NCCL code has run: safe to unmap */
            free(n);
            return st;
        }
        memcpy((char *)&n->fn + nccl_symbols[i].offset, &f, sizeof f);
    }
    atlas_status st = check_version(n);
    if (st != ATLAS_OK) {
        free(n);
        return st;
    }
    /* dl stays open on purpose (see nccl.h) */
    *out = n;
    return ATLAS_OK;
}

atlas_status atlas_nccl_close(atlas_nccl *nccl) {
    if (!nccl) return ATLAS_OK;
    int live = atomic_load(&nccl->live_comms);
    if (live) return atlas_fail(ATLAS_ERR_BUSY, "NCCL: %d communicator(s) still live", live);
    free(nccl);
    return ATLAS_OK;
}

int atlas_nccl_version(const atlas_nccl *nccl) { return nccl->version; }
const char *atlas_nccl_path(const atlas_nccl *nccl) { return nccl->path; }
const char *atlas_nccl_env_note(const atlas_nccl *nccl) { return nccl->env_note; }

atlas_status atlas_nccl_unique_id(atlas_nccl *nccl, atlas_nccl_id *out) {
    ncclUniqueId id;
    NCCL_CALL(nccl, NULL, ncclGetUniqueId, &id);
    memcpy(out->bytes, id.internal, sizeof out->bytes);
    return ATLAS_OK;
}

atlas_status atlas_nccl_comm_init(atlas_nccl *nccl, int world, int rank, const atlas_nccl_id *id,
                                  atlas_nccl_comm **out) {
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world)
        return atlas_fail(ATLAS_ERR_INVALID, "NCCL: rank %d of %d", rank, world);
    ncclUniqueId uid;
    memcpy(uid.internal, id->bytes, sizeof uid.internal);
    ncclComm_t comm = NULL;
    NCCL_CALL(nccl, NULL, ncclCommInitRank, &comm, world, uid, rank);
    int count = -1, me = -1;
    ncclResult_t r = nccl->fn.ncclCommCount(comm, &count);
    atlas_status st = ATLAS_OK;
    if (r != ATLAS_NCCL_SUCCESS) st = nccl_fail(nccl, comm, "ncclCommCount", r, __LINE__);
    if (st == ATLAS_OK && (r = nccl->fn.ncclCommUserRank(comm, &me)) != ATLAS_NCCL_SUCCESS)
        st = nccl_fail(nccl, comm, "ncclCommUserRank", r, __LINE__);
    if (st == ATLAS_OK && (count != world || me != rank))
        st = atlas_fail(ATLAS_ERR_INTERNAL, "NCCL: communicator has rank %d of %d, asked for "
                        "rank %d of %d", me, count, rank, world);
    atlas_nccl_comm *c = st == ATLAS_OK ? calloc(1, sizeof *c) : NULL;
    if (st == ATLAS_OK && !c) st = atlas_fail(ATLAS_ERR_NOMEM, "NCCL: out of memory");
    if (st != ATLAS_OK) {
        nccl->fn.ncclCommDestroy(comm); /* the first error is the one to report */
        return st;
    }
    c->nccl = nccl;
    c->comm = comm;
    c->world = world;
    c->rank = rank;
    atomic_fetch_add(&nccl->live_comms, 1);
    *out = c;
    return ATLAS_OK;
}

atlas_status atlas_nccl_comm_destroy(atlas_nccl_comm *comm) {
    if (!comm) return ATLAS_OK;
    atlas_nccl *n = comm->nccl;
    ncclResult_t r = n->fn.ncclCommDestroy(comm->comm);
    atomic_fetch_sub(&n->live_comms, 1);
    free(comm);
    return r == ATLAS_NCCL_SUCCESS ? ATLAS_OK : nccl_fail(n, NULL, "ncclCommDestroy", r, __LINE__);
}

int atlas_nccl_comm_world(const atlas_nccl_comm *comm) { return comm->world; }
int atlas_nccl_comm_rank(const atlas_nccl_comm *comm) { return comm->rank; }

static int nccl_type(atlas_dtype t) {
    switch (t) {
    case ATLAS_DTYPE_F32: return ATLAS_NCCL_FLOAT32;
    case ATLAS_DTYPE_F16: return ATLAS_NCCL_FLOAT16;
    case ATLAS_DTYPE_BF16: return ATLAS_NCCL_BFLOAT16;
    case ATLAS_DTYPE_I32: return ATLAS_NCCL_INT32;
    case ATLAS_DTYPE_I64: return ATLAS_NCCL_INT64;
    case ATLAS_DTYPE_U8: return ATLAS_NCCL_UINT8;
    default: return -1;
    }
}

atlas_status atlas_nccl_all_reduce_sum(atlas_nccl_comm *comm, const void *send, void *recv,
                                       size_t count, atlas_dtype dtype, atlas_nccl_stream stream) {
    int type = nccl_type(dtype);
    if (type < 0)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "NCCL all-reduce: dtype %s",
                          atlas_dtype_name(dtype));
    NCCL_CALL(comm->nccl, comm->comm, ncclAllReduce, send, recv, count, type, ATLAS_NCCL_SUM,
              comm->comm, stream);
    return ATLAS_OK;
}

atlas_status atlas_nccl_group_start(atlas_nccl *nccl) {
    ncclResult_t r = nccl->fn.ncclGroupStart();
    return r == ATLAS_NCCL_SUCCESS ? ATLAS_OK : nccl_fail(nccl, NULL, "ncclGroupStart", r, __LINE__);
}

atlas_status atlas_nccl_group_end(atlas_nccl *nccl) {
    ncclResult_t r = nccl->fn.ncclGroupEnd();
    return r == ATLAS_NCCL_SUCCESS ? ATLAS_OK : nccl_fail(nccl, NULL, "ncclGroupEnd", r, __LINE__);
}
