/* backend/cuda/weight_fill.h — the host side of a weight upload: the bytes of a fused bf16
 * weight (views concatenated, f16/f32 converted to bf16), produced piece by piece into the
 * pinned staging buffers.  No driver calls, so a CPU test checks it.  Internal to
 * backend/cuda. */
#ifndef ATLAS_CUDA_WEIGHT_FILL_H
#define ATLAS_CUDA_WEIGHT_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"

/* Writes bytes [a, b) of the fused bf16 weight made of views[0..n) (a and b even) to
 * dst + (a - dst_offset): dst holds the weight's bytes from dst_offset on.  bf16 views are
 * read with pread from their shard's descriptor when they have one (no page faults:
 * bench/RESULTS.md, "CUDA host and registry"), else copied out of the mapping. */
void atlas_cuda_fill_weight(const atlas_tensor_view *const *views, int n, char *dst,
                            size_t dst_offset, size_t a, size_t b);

/* n bytes of a file at file_off, mapped at src, into dst: pread from fd when it has one, else
 * (or when the read fails) copied out of the mapping. */
void atlas_cuda_read_bytes(void *dst, const char *src, int fd, uint64_t file_off, size_t n);

#endif
