/* tests/cuda-trace/trace.c — the CUDA backend's driver calls, logged against a fake driver,
 * while model/forward.c runs tiny checkpoints: tools/cuda_trace.sh builds it for two revisions
 * and diffs the logs.
 *
 * What it proves: with the same checkpoint and batches, two builds make the same driver calls
 * in the same order once the weights are loaded — every kernel launch (function, grid, block,
 * shared memory, PDL and cluster attributes, and every argument: pointers as the allocation
 * or the model buffer they fall in, plus offset; scalars by value), graph capture, instantiate
 * and replay, cuBLASLt matmuls (a fake libcublasLt: shapes, types, operands), allocations,
 * copies, memsets, events and syncs. It covers create, a 20-token and an 80-token prefill (one
 * MLP chunk), decode steps captured as a graph and replayed, greedy steps queued a step ahead,
 * a two-sequence decode, a 150-token prefill over two MLP chunks, and release; each with
 * cuBLASLt, without it, without PDL and without graphs; and, per run, on a Hopper device
 * (cuLaunchKernelEx: PDL, cluster attention at head_dim 64/128) or (--cc 8) an older one.
 * What it cannot: timing, and the numerics of the kernels (nothing runs on a GPU; the fake
 * returns zeros): a trace that differs may still be right, and one that matches says the
 * host code did not change the GPU's work — not that the kernels are right. The weight upload
 * (loader threads) is not logged call by call: its results are checked by name (every weight
 * and activation buffer is named by its role), so a change to how weights load does not show
 * as a difference.
 *
 * Usage: trace [--cc MAJOR] [--sms N] OUT.txt MODEL_DIR...   (built and run by
 * tools/cuda_trace.sh; --sms: the device's SM count, 132 by default: a small one makes the
 * one-row GEMVs take several row groups a block, the gemv1c kernels) */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/driver.h"
#include "core/error.h"
#include "model/forward.h"
#include "model/model_internal.h"

static pthread_t main_t;
static FILE *out;
static int quiet = 1; /* nothing logged while a model loads (the loader's calls) */
#define MAIN (pthread_equal(pthread_self(), main_t))
static void logf_(const char *fmt, ...) {
    if (!MAIN || quiet) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}
#define LOG(...) logf_(__VA_ARGS__)

/* --- names of pointers: model buffers by role, other allocations by number ------------------ */

enum { MAXA = 16384 };
static struct { uintptr_t p; size_t n; int id; char kind; char name[40]; } al[MAXA];
static int n_al, next_id;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void add(uintptr_t p, size_t n, char kind) {
    pthread_mutex_lock(&mu);
    if (n_al < MAXA) {
        al[n_al].p = p; al[n_al].n = n; al[n_al].kind = kind; al[n_al].name[0] = 0;
        al[n_al].id = MAIN ? next_id++ : -1;
        n_al++;
    }
    pthread_mutex_unlock(&mu);
}

/* A named range (a weight, an activation buffer, the KV cache): found before allocations. */
enum { MAXN = 4096 };
static struct { uintptr_t p; size_t n; char name[40]; } nr[MAXN];
static int n_nr;
static void name_range(uintptr_t p, size_t n, const char *fmt, ...) {
    if (!p || n_nr == MAXN) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nr[n_nr].name, sizeof nr[n_nr].name, fmt, ap);
    va_end(ap);
    nr[n_nr].p = p;
    nr[n_nr].n = n ? n : 1;
    n_nr++;
}

static const char *nm(uintptr_t p) {
    static __thread char buf[16][64];
    static __thread int k;
    char *b = buf[k++ % 16];
    if (!p) return "0";
    for (int i = n_nr - 1; i >= 0; i--)
        if (p >= nr[i].p && p < nr[i].p + nr[i].n) {
            snprintf(b, 64, "%s+%zu", nr[i].name, (size_t)(p - nr[i].p));
            return b;
        }
    pthread_mutex_lock(&mu);
    for (int i = n_al - 1; i >= 0; i--)
        if (al[i].p && p >= al[i].p && p < al[i].p + (al[i].n ? al[i].n : 1)) {
            snprintf(b, 64, "%c%d+%zu", al[i].kind, al[i].id, (size_t)(p - al[i].p));
            pthread_mutex_unlock(&mu);
            return b;
        }
    pthread_mutex_unlock(&mu);
    snprintf(b, 64, "?");
    return b;
}

static void drop(uintptr_t p) {
    pthread_mutex_lock(&mu);
    for (int i = n_al - 1; i >= 0; i--)
        if (al[i].p == p) { al[i].p = 0; break; }
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n_nr; i++)
        if (nr[i].p == p) nr[i].p = 0;
}

/* --- kernel arguments: the signature of each kernel as the host passes it --------------------
 * P pointer (8 bytes, named), i int, f float, l long long, g a gate activation
 * (cuda_glu_act). A kernel missing here is logged with "args ?" (add it: a launch whose
 * arguments are not compared proves less). */
static const struct { const char *name, *sig; } sigs[] = {
    {"atlas_embed", "PPPPif"}, {"atlas_gather_rows", "PPPi"}, {"atlas_add_rmsnorm", "PPPPifP"},
    {"atlas_qk_norm", "PPPiiif"}, {"atlas_rope", "PPiiii"}, {"atlas_kv_store", "PPPPiii"},
    {"atlas_swiglu", "PPilg"}, {"atlas_swiglu_bf16", "PPilg"}, {"atlas_argmax", "PPPi"},
    {"atlas_argmax_wide", "PPPPPi"}, {"atlas_stage", "PPiiiPPiiiiff"},
    {"atlas_rope_kv_store", "PPPPPiiii"}, {"atlas_gemv1b", "PPPPiii"}, {"atlas_gemv1c", "PPPPiiii"},
    {"atlas_gemv_mma", "PPPPiii"}, {"atlas_gemv4", "PPPPiii"}, {"atlas_gemv8", "PPPPiii"},
    {"atlas_gemm", "PPPPiii"}, {"atlas_f32_to_bf16", "PPl"}, {"atlas_add_bias", "PPil"},
    {"atlas_gemv1b_swiglu", "PPPPiiPfPPg"}, {"atlas_gemv1b_norm_swiglu", "PPPPiiPfPPg"},
    {"atlas_gemv1c_swiglu", "PPPPiiPfPPgi"}, {"atlas_gemv1c_norm_swiglu", "PPPPiiPfPPgi"},
    {"atlas_gemv1b_qkv", "PPPPiiPfPPPPPiiii"}, {"atlas_gemv1b_norm_qkv", "PPPPiiPfPPPPPiiii"},
    {"atlas_gemv1c_qkv", "PPPPiiPfPPPPPiiiii"}, {"atlas_gemv1c_norm_qkv", "PPPPiiPfPPPPPiiiii"},
    {"atlas_gemv1b_norm", "PPPPiiPfPP"}, {"atlas_gemv1b_resid", "PPPPiiPfPP"},
    {"atlas_gemv1c_norm", "PPPPiiPfPPi"}, {"atlas_gemv1c_resid", "PPPPiiPfPPi"},
    {"atlas_attn_split", "PPPPPPPPiiiiiiiiifPPP"}, {"atlas_attn_combine", "PPPiiiP"},
    {"atlas_attn_prefill*", "PPPPPPPPiiiiifP"}, {"atlas_attn_dec*", "PPPPPPPPiiiiiifPPiP"},
    {"atlas_attn_dcl*", "PPPPPPPPiiiiiifPPiP"},
    {"atlas_moe_logits", "PPPPiii"}, {"atlas_moe_topk", "PPPiiii"}, {"atlas_moe_plan", "PPPPiii"},
    {"atlas_moe_gu_slots*", "PPPPPPiiiig"}, {"atlas_moe_down_slots*", "PPPPPPPiiii"},
    {"atlas_moe_gu_grouped*", "PPPPPPPiiig"}, {"atlas_moe_down_grouped*", "PPPPPii"},
    {"atlas_moe_combine", "PPPPPPii"},
};

static const char *sig_of(const char *fn) {
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        size_t n = strlen(sigs[i].name);
        if (sigs[i].name[n - 1] == '*' ? !strncmp(fn, sigs[i].name, n - 1) : !strcmp(fn, sigs[i].name))
            return sigs[i].sig;
    }
    return NULL;
}

static void fmt_args(char *b, size_t cap, const char *fn, void **params) {
    const char *sig = sig_of(fn);
    size_t o = 0;
    if (!sig || !params) { snprintf(b, cap, "args ?"); return; }
    o += (size_t)snprintf(b + o, cap - o, "args");
    for (int i = 0; sig[i] && o < cap; i++) {
        const void *a = params[i];
        switch (sig[i]) {
        case 'P': o += (size_t)snprintf(b + o, cap - o, " %s", nm((uintptr_t)*(const uint64_t *)a)); break;
        case 'i': o += (size_t)snprintf(b + o, cap - o, " %d", *(const int *)a); break;
        case 'f': o += (size_t)snprintf(b + o, cap - o, " %.9g", (double)*(const float *)a); break;
        case 'l': o += (size_t)snprintf(b + o, cap - o, " %lld", *(const long long *)a); break;
        case 'g': {
            const cuda_glu_act *g = a;
            o += (size_t)snprintf(b + o, cap - o, " glu(%d %.9g %.9g)", g->kind, (double)g->alpha,
                                  (double)g->limit);
            break;
        }
        }
    }
}

/* --- the fake driver -------------------------------------------------------------------------- */

static int fk_ctx, fk_stream, n_ev, ev_base, n_graph, fake_cc = 9, fake_sms = 132;
static void *fk_current;
static CUresult f_ok(void) { return 0; }
static CUresult f_init(unsigned int flags) { (void)flags; return 0; }
static CUresult f_version(int *v) { *v = 13000; return 0; }
static CUresult f_err_name(CUresult e, const char **name) { (void)e; *name = "CUDA_ERROR_FAKE"; return 0; }
static CUresult f_err_string(CUresult e, const char **text) { (void)e; *text = "fake"; return 0; }
static CUresult f_dev_get(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
static CUresult f_dev_count(int *n) { *n = 1; return 0; }
static CUresult f_dev_name(char *name, int len, CUdevice d) { (void)d; snprintf(name, (size_t)len, "Fake"); return 0; }
static CUresult f_dev_attr(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    *v = a == ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MAJOR ? fake_cc
       : a == ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MINOR ? 0
       : a == ATLAS_CU_ATTR_MULTIPROCESSOR_COUNT ? fake_sms : a == ATLAS_CU_ATTR_INTEGRATED ? 0 : 65536;
    return 0;
}
static CUresult f_total_mem(size_t *b, CUdevice d) { (void)d; *b = (size_t)80 << 30; return 0; }
static CUresult f_retain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&fk_ctx; return 0; }
static CUresult f_release(CUdevice d) { (void)d; return 0; }
static CUresult f_set_current(CUcontext c) { fk_current = c; return 0; }
static CUresult f_get_current(CUcontext *c) { *c = fk_current; return 0; }
static CUresult f_stream_create(CUstream *s, unsigned int flags) { (void)flags; *s = (CUstream)&fk_stream; return 0; }
static CUresult f_stream_sync(CUstream s) { (void)s; LOG("cuStreamSynchronize"); return 0; }
static CUresult f_stream(CUstream s) { (void)s; return 0; }
static const char *ev_name(CUevent e) {
    static __thread char b[4][24];
    static __thread int k;
    char *s = b[k++ % 4];
    int id = (int)((uintptr_t)e - 0x1000);
    if (id > ev_base) snprintf(s, 24, "E%d", id - ev_base);
    else snprintf(s, 24, "EL"); /* made while a model loaded */
    return s;
}
static CUresult f_event_create(CUevent *e, unsigned int flags) {
    pthread_mutex_lock(&mu);
    *e = (CUevent)(uintptr_t)(0x1000 + ++n_ev);
    pthread_mutex_unlock(&mu);
    LOG("cuEventCreate %s %u", ev_name(*e), flags);
    return 0;
}
static CUresult f_event_record(CUevent e, CUstream s) { (void)s; LOG("cuEventRecord %s", ev_name(e)); return 0; }
static CUresult f_event_sync(CUevent e) { LOG("cuEventSynchronize %s", ev_name(e)); return 0; }
static CUresult f_event_destroy(CUevent e) { LOG("cuEventDestroy %s", ev_name(e)); return 0; }
static CUresult f_event(CUevent e) { (void)e; return 0; }
static CUresult f_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    LOG("cuMemcpyHtoDAsync %s %s %zu", nm(dst), nm((uintptr_t)src), n);
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static CUresult f_host_alloc(void **p, size_t bytes, unsigned int flags) {
    *p = calloc(1, bytes);
    add((uintptr_t)*p, bytes, 'H');
    LOG("cuMemHostAlloc %s %zu %u", nm((uintptr_t)*p), bytes, flags);
    return 0;
}
static CUresult f_host_devptr(CUdeviceptr *d, void *p, unsigned int flags) {
    *d = (CUdeviceptr)(uintptr_t)p;
    LOG("cuMemHostGetDevicePointer %s %u", nm((uintptr_t)p), flags);
    return 0;
}
static CUresult f_free_host(void *p) { LOG("cuMemFreeHost %s", nm((uintptr_t)p)); drop((uintptr_t)p); free(p); return 0; }
static int fk_module;
static CUresult f_module_load(CUmodule *m, const void *image) { (void)image; *m = (CUmodule)&fk_module; LOG("cuModuleLoadData"); return 0; }
static CUresult f_module_unload(CUmodule m) { (void)m; LOG("cuModuleUnload"); return 0; }
static CUresult f_get_function(CUfunction *fn, CUmodule m, const char *name) {
    (void)m;
    *fn = (CUfunction)strdup(name);
    LOG("cuModuleGetFunction %s", name);
    return 0;
}
static CUresult f_alloc(CUdeviceptr *p, size_t bytes) {
    void *q = calloc(1, bytes ? bytes : 1);
    *p = (CUdeviceptr)(uintptr_t)q;
    add((uintptr_t)q, bytes, 'D');
    LOG("cuMemAlloc %s %zu", nm(*p), bytes);
    return 0;
}
static CUresult f_free(CUdeviceptr p) { LOG("cuMemFree %s", nm(p)); drop(p); free((void *)(uintptr_t)p); return 0; }
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) {
    LOG("cuMemcpyHtoD %s %zu", nm(dst), n);
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static CUresult f_dtoh_async(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    LOG("cuMemcpyDtoHAsync %s %zu", nm(src), n);
    memset(dst, 0, n);
    return 0;
}
static CUresult f_memset8(CUdeviceptr dst, unsigned char v, size_t n) { LOG("cuMemsetD8 %s %u %zu", nm(dst), v, n); return 0; }
static CUresult f_memset8a(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
    (void)s;
    LOG("cuMemsetD8Async %s %u %zu", nm(dst), v, n);
    return 0;
}
static CUresult f_memset32a(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
    (void)s;
    LOG("cuMemsetD32Async %s %u %zu", nm(dst), v, n);
    return 0;
}
static CUresult f_mem_info(size_t *f, size_t *t) { *f = (size_t)70 << 30; *t = (size_t)80 << 30; return 0; }
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
    (void)s; (void)extra;
    char a[1024];
    fmt_args(a, sizeof a, (const char *)f, params);
    LOG("cuLaunchKernel %s grid %u,%u,%u block %u,%u,%u smem %u %s", (const char *)f, gx, gy, gz,
        bx, by, bz, smem, a);
    return 0;
}

/* cuLaunchKernelEx, called by the fake libcuda.so.1 (fake_libs.c) that the backend finds with
 * dlopen(RTLD_NOLOAD): its config as ops_cuda.c lays it out (CUlaunchConfig). */
typedef struct { int id; char pad[4]; union { char bytes[64]; int i; unsigned dims[3]; } v; } fk_attr;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    fk_attr *attrs;
    unsigned n_attrs;
} fk_config;
int trace_launch_ex(const void *config, void *f, void **params, void **extra) {
    const fk_config *c = config;
    (void)extra;
    char a[1024], at[256];
    size_t o = 0;
    at[0] = 0;
    for (unsigned i = 0; i < c->n_attrs && o < sizeof at; i++) {
        const fk_attr *x = &c->attrs[i];
        if (x->id == 4)
            o += (size_t)snprintf(at + o, sizeof at - o, " cluster(%u,%u,%u)", x->v.dims[0],
                                  x->v.dims[1], x->v.dims[2]);
        else
            o += (size_t)snprintf(at + o, sizeof at - o, " attr%d=%d", x->id, x->v.i);
    }
    fmt_args(a, sizeof a, (const char *)f, params);
    LOG("cuLaunchKernelEx %s grid %u,%u,%u block %u,%u,%u smem %u%s %s", (const char *)f, c->gx,
        c->gy, c->gz, c->bx, c->by, c->bz, c->smem, at, a);
    return 0;
}

/* cublasLtMatmul, called by the fake libcublasLt (fake_libs.c): the layouts' shapes and types
 * it was made with, and the operands. */
void trace_lt_matmul(const char *desc, const void *a, const void *b, const void *c, const void *d,
                     const void *ws, size_t ws_bytes) {
    LOG("cublasLtMatmul %s A %s B %s C %s D %s ws %s %zu", desc, nm((uintptr_t)a),
        nm((uintptr_t)b), nm((uintptr_t)c), nm((uintptr_t)d), nm((uintptr_t)ws), ws_bytes);
}
void trace_log(const char *what) { LOG("%s", what); }

static CUresult f_begin(CUstream s, CUstreamCaptureMode m) { (void)s; LOG("cuStreamBeginCapture %d", (int)m); return 0; }
static int graph_base;
static CUresult f_end(CUstream s, CUgraph *g) {
    (void)s;
    *g = (CUgraph)(uintptr_t)(0x100 + ++n_graph);
    LOG("cuStreamEndCapture G%d", n_graph - graph_base);
    return 0;
}
static CUresult f_inst(CUgraphExec *e, CUgraph g, unsigned long long fl) {
    *e = (CUgraphExec)(uintptr_t)((uintptr_t)g + 0x10000);
    LOG("cuGraphInstantiate G%d %llu", (int)((uintptr_t)g - 0x100) - graph_base, fl);
    return 0;
}
static CUresult f_glaunch(CUgraphExec e, CUstream s) { (void)s; LOG("cuGraphLaunch X%d", (int)((uintptr_t)e - 0x10100) - graph_base); return 0; }
static CUresult f_gxdestroy(CUgraphExec e) { LOG("cuGraphExecDestroy X%d", (int)((uintptr_t)e - 0x10100) - graph_base); return 0; }
static CUresult f_gdestroy(CUgraph g) { LOG("cuGraphDestroy G%d", (int)((uintptr_t)g - 0x100) - graph_base); return 0; }

static void install(void) {
    atlas_driver d;
    memset(&d, 0, sizeof d);
    d.cuInit = f_init; d.cuDriverGetVersion = f_version; d.cuGetErrorName = f_err_name;
    d.cuGetErrorString = f_err_string; d.cuDeviceGet = f_dev_get; d.cuDeviceGetCount = f_dev_count;
    d.cuDeviceGetName = f_dev_name; d.cuDeviceGetAttribute = f_dev_attr; d.cuDeviceTotalMem = f_total_mem;
    d.cuDevicePrimaryCtxRetain = f_retain; d.cuDevicePrimaryCtxRelease = f_release;
    d.cuCtxSetCurrent = f_set_current; d.cuCtxGetCurrent = f_get_current;
    d.cuCtxSynchronize = (CUresult (*)(void))f_ok; d.cuStreamCreate = f_stream_create;
    d.cuStreamDestroy = f_stream; d.cuStreamSynchronize = f_stream_sync;
    d.cuEventCreate = f_event_create; d.cuEventRecord = f_event_record; d.cuEventSynchronize = f_event_sync;
    d.cuEventQuery = f_event; d.cuEventDestroy = f_event_destroy; d.cuMemcpyHtoDAsync = f_htod_async;
    d.cuMemHostAlloc = f_host_alloc; d.cuMemFreeHost = f_free_host; d.cuMemHostGetDevicePointer = f_host_devptr;
    d.cuModuleLoadData = f_module_load; d.cuModuleUnload = f_module_unload; d.cuModuleGetFunction = f_get_function;
    d.cuMemAlloc = f_alloc; d.cuMemFree = f_free; d.cuMemcpyHtoD = f_htod; d.cuMemsetD8 = f_memset8;
    d.cuMemsetD8Async = f_memset8a; d.cuMemsetD32Async = f_memset32a; d.cuMemGetInfo = f_mem_info; d.cuLaunchKernel = f_launch;
    d.cuMemcpyDtoHAsync = f_dtoh_async; d.cuStreamBeginCapture = f_begin; d.cuStreamEndCapture = f_end;
    d.cuGraphInstantiateWithFlags = f_inst; d.cuGraphLaunch = f_glaunch; d.cuGraphExecDestroy = f_gxdestroy;
    d.cuGraphDestroy = f_gdestroy;
    if (atlas_driver_install_for_test(&d, 13000) != ATLAS_OK) {
        fprintf(stderr, "trace: installing the fake driver: %s\n", atlas_last_error());
        exit(1);
    }
}

/* --- the scenario ----------------------------------------------------------------------------- */

static int failures;
#define T(x) do { atlas_status s_ = (x); LOG("-> %s = %d", #x, (int)s_); \
    if (s_ != ATLAS_OK) { failures++; fprintf(stderr, "trace: %s: %s\n", #x, atlas_last_error()); } } while (0)

static void wname(const atlas_weight *w, const char *what, int l) {
    if (!w) return;
    size_t bytes = (size_t)(w->rows * w->cols * 2);
    if (l < 0) name_range((uintptr_t)w->ptr, bytes, "W.%s", what);
    else name_range((uintptr_t)w->ptr, bytes, "W%d.%s", l, what);
}

/* Every weight, activation buffer and the KV cache by role: the trace names what the kernels
 * read and write whatever order the loader allocated them in. */
static void name_model(atlas_model *m) {
    n_nr = 0;
    wname(m->w.embed, "embed", -1);
    wname(m->w.norm, "norm", -1);
    if (m->w.lm_head != m->w.embed) wname(m->w.lm_head, "lm_head", -1);
    for (int l = 0; l < m->w.n_layers; l++) {
        const atlas_layer_weights *lw = &m->w.layers[l];
        wname(lw->attn_norm, "attn_norm", l); wname(lw->qkv, "qkv", l);
        wname(lw->qkv_bias, "qkv_bias", l); wname(lw->q_norm, "q_norm", l);
        wname(lw->k_norm, "k_norm", l); wname(lw->o, "o", l); wname(lw->mlp_norm, "mlp_norm", l);
        wname(lw->gate_up, "gate_up", l); wname(lw->down, "down", l);
    }
    const atlas_backend_geom *g = &m->be->geom;
    size_t T = (size_t)m->max_batch_tokens, C = (size_t)m->mlp_chunk, d = (size_t)g->hidden;
    size_t qkv = (size_t)(g->n_heads + 2 * g->n_kv_heads) * g->head_dim, f = (size_t)g->intermediate;
    name_range((uintptr_t)m->acts.x, T * d * 4, "A.x");
    name_range((uintptr_t)m->acts.h, T * d * 4, "A.h");
    name_range((uintptr_t)m->acts.qkv, T * qkv * 4, "A.qkv");
    name_range((uintptr_t)m->acts.att, T * g->n_heads * g->head_dim * 4, "A.att");
    name_range((uintptr_t)m->acts.o, T * d * 4, "A.o");
    name_range((uintptr_t)m->acts.gate_up, C * 2 * f * 4, "A.gate_up");
    name_range((uintptr_t)m->acts.act, C * f * 4, "A.act");
    /* rows and logits may lie inside gate_up: named after it, so found first */
    name_range((uintptr_t)m->acts.rows, T * d * 4, "A.rows");
    name_range((uintptr_t)m->acts.logits, (size_t)m->logit_chunk * g->vocab_size * 4, "A.logits");
    name_range((uintptr_t)m->kv->base, m->kv->layer_elems * 4 * (size_t)g->n_layers, "KV");
}

typedef struct seq { int first_block, ctx; } seq;

/* A batch of one or more sequences, each adding n[s] tokens; logits of each one's last. */
typedef struct batch_buf {
    int32_t tok[512], pos[512], ss[9], ctx[8], table[8 * 16], rows[8];
    atlas_batch b;
} batch_buf;

static atlas_batch *make(batch_buf *bb, seq *s, int ns, const int *n, int vocab, int null_tokens) {
    int t = 0;
    for (int i = 0; i < ns; i++) {
        bb->ss[i] = t;
        for (int j = 0; j < n[i]; j++, t++) {
            bb->tok[t] = (t * 7919 + i * 31 + s[i].ctx) % vocab;
            bb->pos[t] = s[i].ctx + j;
        }
        s[i].ctx += n[i];
        bb->ctx[i] = s[i].ctx;
        for (int k = 0; k < 16; k++) bb->table[i * 16 + k] = s[i].first_block + k;
        bb->rows[i] = t - 1;
    }
    bb->ss[ns] = t;
    bb->b = (atlas_batch){.n_tokens = t, .tokens = null_tokens ? NULL : bb->tok, .positions = bb->pos,
                          .n_seqs = ns, .seq_start = bb->ss, .seq_ctx = bb->ctx,
                          .block_table = bb->table, .max_blocks = 16, .n_logits = ns,
                          .logit_rows = bb->rows};
    return &bb->b;
}

static void scenario(const char *dir, const char *variant, const atlas_backend_options *opt) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.kv_blocks = 64;
    p.kv_block_size = 16;
    p.max_batch_tokens = 256;
    p.mlp_chunk_tokens = 128;
    p.load_tokenizer = 0;
    quiet = 0;
    LOG("=== %s %s", dir, variant);
    quiet = 1;
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load_opts(dir, &p, opt, &m);
    quiet = 0;
    if (st != ATLAS_OK) {
        failures++;
        fprintf(stderr, "trace: loading %s: %s\n", dir, atlas_last_error());
        LOG("load failed");
        return;
    }
    /* numbering from here: the load's calls are not compared */
    next_id = 1000;
    ev_base = n_ev;
    graph_base = n_graph;
    name_model(m);
    LOG("-> loaded");
    int V = m->cfg.vocab_size;
    float *logits = malloc((size_t)4 * V * sizeof *logits);
    int32_t ids[8];
    batch_buf bb;
    seq a = {0, 0}, b2[2] = {{16, 0}, {32, 0}}, c = {48, 0};
    int n20 = 20, n1 = 1, n80 = 80, n12 = 12, n150 = 150, one2[2] = {1, 1};
    /* prefill, then decode steps: the first captures a graph, the others replay it */
    T(atlas_model_forward_argmax(m, make(&bb, &a, 1, &n20, V, 0), ids));
    for (int i = 0; i < 3; i++) T(atlas_model_forward_argmax(m, make(&bb, &a, 1, &n1, V, 0), ids));
    T(atlas_model_forward(m, make(&bb, &a, 1, &n1, V, 0), logits));
    /* greedy steps queued a step ahead, tokens from the step before on the device */
    T(atlas_model_forward_argmax_queue(m, make(&bb, &a, 1, &n1, V, 0)));
    T(atlas_model_forward_argmax_queue(m, make(&bb, &a, 1, &n1, V, 1)));
    T(atlas_model_argmax_collect(m, ids, 1));
    T(atlas_model_forward_argmax_queue(m, make(&bb, &a, 1, &n1, V, 1)));
    T(atlas_model_argmax_collect(m, ids, 1));
    T(atlas_model_argmax_collect(m, ids, 1));
    /* two sequences: an 80-token prefill (one MLP chunk of >= 64 rows) and a 12-token one,
     * then decoding together */
    T(atlas_model_forward_argmax(m, make(&bb, &b2[0], 1, &n80, V, 0), ids));
    T(atlas_model_forward_argmax(m, make(&bb, &b2[1], 1, &n12, V, 0), ids));
    for (int i = 0; i < 3; i++) T(atlas_model_forward_argmax(m, make(&bb, b2, 2, one2, V, 0), ids));
    /* 150 tokens: two MLP chunks (128 + 22 rows), logits downloaded */
    T(atlas_model_forward(m, make(&bb, &c, 1, &n150, V, 0), logits));
    T(atlas_model_forward_argmax(m, make(&bb, &c, 1, &n1, V, 0), ids));
    T(atlas_model_release(m));
    free(logits);
    n_nr = 0;
    LOG("end");
}

int main(int argc, char **argv) {
    main_t = pthread_self();
    int ai = 1;
    for (;;) {
        if (ai + 1 < argc && !strcmp(argv[ai], "--cc")) fake_cc = atoi(argv[ai + 1]);
        else if (ai + 1 < argc && !strcmp(argv[ai], "--sms")) fake_sms = atoi(argv[ai + 1]);
        else break;
        ai += 2;
    }
    if (argc - ai < 2) {
        fprintf(stderr, "usage: trace [--cc N] [--sms N] OUT.txt MODEL_DIR...\n");
        return 2;
    }
    out = fopen(argv[ai], "w");
    if (!out) { perror(argv[ai]); return 2; }
    install();
    static const struct { const char *name; atlas_backend_options o; } variants[] = {
        {"default", {0}},
        {"no_cublaslt", {.no_cublaslt = 1}},
        {"no_pdl", {.no_pdl = 1}},
        {"no_graphs", {.no_graphs = 1}},
    };
    for (int i = ai + 1; i < argc; i++)
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++)
            scenario(argv[i], variants[v].name, &variants[v].o);
    fclose(out);
    if (failures) fprintf(stderr, "trace: %d call(s) failed (see the log)\n", failures);
    return failures ? 1 : 0;
}
