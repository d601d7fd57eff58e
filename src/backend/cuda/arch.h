/* backend/cuda/arch.h — the kernel choices a GPU gets, made once per model from the device's
 * compute capability and shared memory: which image the modules come from (the fatbin's
 * machine code, or the compute_80 PTX with `--kernels portable`), whether decode attention
 * runs in thread-block clusters and kernels launch with programmatic dependent launch
 * (sm_90+), and the split attention kernel's tile budget.  Internal to backend/cuda.
 *
 * Portable mode stands in for an RTX card (sm_86) on whatever GPU is there: the PTX is
 * compiled by the driver, the choices are sm_86's, and shared memory is capped at sm_86's
 * 99 KB a block and 100 KB a multiprocessor. */
#ifndef ATLAS_CUDA_ARCH_H
#define ATLAS_CUDA_ARCH_H

#include <stdbool.h>

#include "atlas/host.h"

typedef struct cuda_arch {
    int cc_major, cc_minor; /* whose choices apply: the device's, or 8.6 when portable */
    int sm_count;           /* the device's */
    int smem_block;         /* shared memory a block may use (opt-in) */
    int smem_sm;            /* shared memory a multiprocessor has for blocks */
    bool portable;          /* modules from the compute_80 PTX, compiled by the driver */
    bool clusters;          /* decode attention merges its splits in a cluster (sm_90+) */
    bool pdl;               /* programmatic dependent launch (sm_90+) */
    int attn_split_smem;    /* dynamic shared memory of one split attention block */
    int attn_target_blocks; /* blocks a decode attention launch aims for: 4 a multiprocessor */
} cuda_arch;

/* The choices for device `p`; portable: `--kernels portable`; no_pdl: PDL off even where it
 * could be on (atlas_backend_options.no_pdl). */
void cuda_arch_pick(const atlas_host_props *p, bool portable, bool no_pdl, cuda_arch *out);

/* One line for `atlas info`: "sm_90 machine code (cc 9.0); decode attention in clusters; PDL;
 * 227 KB shared memory a block". */
void cuda_arch_describe(const cuda_arch *a, const atlas_host_props *p, char *buf, int size);

/* The split attention kernel's budget when nothing is known of the device: the smallest any
 * device gets, for checks made before a backend exists. */
enum { CUDA_ARCH_ATTN_SMEM_MIN = 16 * 1024 };

#endif
