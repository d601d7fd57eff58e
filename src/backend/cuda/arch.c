/* backend/cuda/arch.c — the kernel choices by compute capability and shared memory
 * (arch.h). */
#include "backend/cuda/arch.h"

#include <stdio.h>

/* sm_86 (RTX 30, A10): what portable mode assumes. */
enum { SM86_SMEM_BLOCK = 99 * 1024, SM86_SMEM_SM = 100 * 1024 };
/* The split attention kernel: at most 43 KiB of dynamic shared memory (48 KiB without opt-in,
 * less the merge's 4 KiB of static memory), and no more than lets 4 blocks share an SM (the
 * 1 KiB each block costs the driver included), so that a 100 KiB SM still runs 4 blocks. */
enum { ATTN_SMEM_MAX = 43 * 1024, ATTN_STATIC = 4 * 1024, BLOCK_RESERVED = 1024,
       ATTN_BLOCKS_PER_SM = 4 };

void cuda_arch_pick(const atlas_host_props *p, bool portable, bool no_pdl, cuda_arch *out) {
    cuda_arch a = {.cc_major = p->cc_major, .cc_minor = p->cc_minor, .sm_count = p->sm_count,
                   .smem_block = p->smem_per_block_optin, .smem_sm = p->smem_per_sm,
                   .portable = portable};
    if (portable) {
        a.cc_major = 8, a.cc_minor = 6;
        if (a.smem_block <= 0 || a.smem_block > SM86_SMEM_BLOCK) a.smem_block = SM86_SMEM_BLOCK;
        if (a.smem_sm <= 0 || a.smem_sm > SM86_SMEM_SM) a.smem_sm = SM86_SMEM_SM;
    }
    bool hopper = a.cc_major >= 9;
    a.clusters = hopper;
    a.pdl = hopper && !no_pdl;
    int budget = ATTN_SMEM_MAX;
    if (a.smem_sm > 0) {
        int fit = a.smem_sm / ATTN_BLOCKS_PER_SM - ATTN_STATIC - BLOCK_RESERVED;
        if (fit < budget) budget = fit;
    }
    if (a.smem_block > 0 && a.smem_block - ATTN_STATIC < budget) budget = a.smem_block - ATTN_STATIC;
    a.attn_split_smem = budget < CUDA_ARCH_ATTN_SMEM_MIN ? CUDA_ARCH_ATTN_SMEM_MIN : budget;
    a.attn_target_blocks = ATTN_BLOCKS_PER_SM * (a.sm_count > 0 ? a.sm_count : 132);
    *out = a;
}

void cuda_arch_describe(const cuda_arch *a, const atlas_host_props *p, char *buf, int size) {
    snprintf(buf, (size_t)size, "%s (cc %d.%d)%s; decode attention %s; %s; %d KB shared memory a "
             "block, %d KB an SM; split attention tiles in %d KB",
             a->portable ? "portable: compute_80 PTX compiled by the driver"
                         : "native: the fatbin's code for this GPU",
             p->cc_major, p->cc_minor, a->portable ? ", sm_86's choices" : "",
             a->clusters ? "in clusters" : "in split blocks",
             a->pdl ? "programmatic dependent launch" : "no programmatic dependent launch",
             a->smem_block / 1024, a->smem_sm / 1024, a->attn_split_smem / 1024);
}
