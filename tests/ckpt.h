/* tests/ckpt.h — small Llama-family checkpoints written at run time (config.json as given,
 * model.safetensors in bf16), for the tests of binding and of the forward's arithmetic. The
 * tensors a geometry calls for come from model/shard.h's list (checkpoint names and shapes,
 * biases and q/k norms as the geometry's flags say); each element's value from a callback. */
#ifndef ATLAS_TEST_CKPT_H
#define ATLAS_TEST_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "atlas/model.h"
#include "model/shard.h"

/* The value of element i (row-major) of tensor `name`; the file holds it rounded to bf16. */
typedef float (*ckpt_fill)(void *user, const char *name, int64_t i);

/* A tensor beyond the geometry's (a stray one, an ignored one). cols 0: a vector. */
typedef struct ckpt_extra {
    const char *name;
    int64_t rows, cols;
} ckpt_extra;

/* DIR/model.safetensors with the tensors of g, less the one named `drop` (NULL: none), then
 * the n_extra extra ones. Returns 1, or 0 after a CHECK failed. */
int ckpt_write_model(const char *dir, const atlas_shard_geom *g, const char *drop,
                     const ckpt_extra *extra, int n_extra, ckpt_fill fill, void *user);

/* The same with every name the geometry gives as "model.X" written as "<prefix>X" (a
 * vision-language checkpoint's text model: "language_model.model."); fill sees the names as
 * written. */
int ckpt_write_model_prefixed(const char *dir, const atlas_shard_geom *g, const char *prefix,
                              const ckpt_extra *extra, int n_extra, ckpt_fill fill, void *user);

/* DIR/model.safetensors with exactly the n tensors t (a family the shard list does not
 * describe: a mixture-of-experts model's). Returns 1, or 0 after a CHECK failed. */
int ckpt_write_tensors(const char *dir, const ckpt_extra *t, int n, ckpt_fill fill, void *user);

/* DIR/NAME = text. Returns 1, or 0 after a CHECK failed. */
int ckpt_write_text(const char *dir, const char *name, const char *text);

/* x rounded to bf16 as the checkpoint holds it. */
float ckpt_bf16(float x);

/* A deterministic value in [-1, 1) from a tensor's name and an element's index, for fills. */
float ckpt_unit(const char *name, int64_t i);

/* The float64 references of the family tests, weights as the checkpoint holds them (fill's
 * values in bf16): out[rows] = W[rows, cols] @ in for the tensor `name`; and
 * out[d] = x * rsqrt(mean(x^2) + eps) * (add + w[j0 + j]) for the norm weight `name` (add 1:
 * Gemma's (1 + w)). */
void ckpt_ref_linear(ckpt_fill fill, void *user, const char *name, int rows, int cols,
                     const double *in, double *out);
void ckpt_ref_rmsnorm(ckpt_fill fill, void *user, const char *name, int64_t j0, double add,
                      const double *x, int d, double eps, double *out);

/* The CPU parameters of those tests: 2 threads, no tokenizer, batches of up to max_t tokens,
 * a KV pool of 2 * max_blocks blocks of block tokens. */
atlas_model_params ckpt_params(int max_t, int block, int max_blocks);

/* One batch of n_seqs (1 or 2) sequences through m: sequence s continues from ctx0[s] cached
 * tokens with count[s] new ones (tokens: theirs in order), the logits of every new token into
 * logits. Its KV takes max_blocks blocks of its own: block b at s * max_blocks + b, or with
 * spread at (b * 5 + s * 3) % (2 * max_blocks) (blocks far apart, the second sequence's
 * elsewhere). rope_len: the batch's seq_rope_len, or NULL. */
atlas_status ckpt_feed(atlas_model *m, int n_seqs, const int32_t *tokens, const int *ctx0,
                       const int *count, const int32_t *rope_len, int max_blocks, bool spread,
                       float *logits);

#endif
