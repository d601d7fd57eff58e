/* kernels/gemv_chain.h — the argument of the atlas_gemv_chain_* kernels (kernels/gemv.cu),
 * shared by the kernels and the host that fills it (src/backend/cuda/ops_cuda.c chain_run):
 * C11 and CUDA C++ read the same layout. A chain is 2..GEMV_CHAIN_MAX one-row GEMVs run by
 * one grid, a grid-wide barrier between them, so that decode's kernel boundaries between the
 * o, gate_up, down and next qkv projections go (each cost ~1.8 us of idle memory). */
#ifndef ATLAS_KERNELS_GEMV_CHAIN_H
#define ATLAS_KERNELS_GEMV_CHAIN_H

enum { GEMV_CHAIN_MAX = 4 };

/* What a phase does (the kernel's name lists its phases' kinds in order: s, n, ns, nq). */
enum {
    GEMV_PHASE_STORE = 0,  /* out = x @ w^T + bias; resid += out when resid (gemv1c_resid) */
    GEMV_PHASE_NORM,       /* the same of rmsnorm(x) * nw, x the residual stream; h written */
    GEMV_PHASE_NORM_SWIGLU, /* NORM, then act = silu(gate) * up of out = gate_up [2f] */
    GEMV_PHASE_NORM_QKV    /* NORM, then out = qkv roped, its k and v heads into the cache */
};

typedef struct gemv_phase {
    float *out;            /* [m] */
    const float *x;        /* [k]: the input, or the residual stream of a NORM phase */
    const void *w;         /* bf16 [m, k] */
    const void *bias;      /* bf16 [m] or NULL */
    const void *nw;        /* NORM: the norm's bf16 weight [k] */
    float *h;              /* NORM: the norm's output [k] (written by block 0), or NULL */
    float *resid;          /* STORE / NORM: the residual stream to add out into, or NULL */
    float *act;            /* NORM_SWIGLU: [m / 2] */
    void *kc, *vc;         /* NORM_QKV: the layer's bf16 key and value pools */
    const int *slots;      /* NORM_QKV: the token's cache slot (slots[0]) */
    const void *cs;        /* NORM_QKV: rope's (cos, sin) table, float2 [hd / 2] */
    int m, k, ng;          /* rows, columns, row groups of 4 a block */
    int H, K, hd;          /* NORM_QKV: heads, kv heads, head dim */
    float eps;             /* NORM */
} gemv_phase;

typedef struct gemv_chain_args {
    gemv_phase p[GEMV_CHAIN_MAX];
    unsigned long long *bar; /* the grid barrier's counter: grows by the grid a barrier, so it
                                stays a multiple of it between launches of one grid size */
} gemv_chain_args;

#endif
