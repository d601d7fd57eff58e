/* backend/cuda/weight_fill.h — the host side of a weight upload: the bytes of a fused bf16
 * weight (sources concatenated, f16/f32 converted to bf16), produced piece by piece into the
 * pinned staging buffers.  No driver calls, so a CPU test checks it.  Internal to
 * backend/cuda. */
#ifndef ATLAS_CUDA_WEIGHT_FILL_H
#define ATLAS_CUDA_WEIGHT_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Writes bytes [a, b) of the fused bf16 weight made of srcs[0..n) (a and b even) to
 * dst + (a - dst_offset): dst holds the weight's bytes from dst_offset on.  bf16 sources are
 * read straight into dst with their reader when they have one (the model's pread: no page
 * faults, bench/RESULTS.md, "CUDA host and registry"), else copied out of their data; f16
 * and f32 sources the same way, through a bounce buffer. A failed read is returned. */
atlas_status atlas_cuda_fill_weight(const atlas_weight_src *const *srcs, int n, char *dst,
                                    size_t dst_offset, size_t a, size_t b);

/* Bytes [offset, offset + n) of src's data into dst: through src->read when it has one (its
 * failure is returned: never the mapping instead), else copied out of src->data. */
atlas_status atlas_cuda_read_bytes(void *dst, const atlas_weight_src *src, uint64_t offset,
                                   size_t n);

#endif
