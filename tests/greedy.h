/* tests/greedy.h — greedy and sampled decoding of one sequence, for the tests of the queued
 * steps (atlas_model_forward_argmax_queue and _sample_queue, model/forward.h). */
#ifndef ATLAS_TEST_GREEDY_H
#define ATLAS_TEST_GREEDY_H

#include <stdint.h>

#include "atlas/model.h"
#include "backend/backend.h"

/* Feeds prompt[n] from position 0 and decodes: ids[0] is the prompt's argmax, ids[i] the
 * argmax after ids[i - 1] was fed, for i < steps. queued 0: atlas_model_forward_argmax token
 * by token; 1: each step queued before the one before is collected, its token taken from
 * that step on the backend (tokens NULL). The sequence's blocks are table[] (block_size
 * tokens each); each batch's max_blocks covers only its context, so that the backend's
 * staged table grows while a step is queued (past 16 blocks). */
atlas_status greedy_run(atlas_model *m, const int32_t *prompt, int n, const int32_t *table,
                        int block_size, int steps, int queued, int32_t *ids);
/* The same with each id drawn by *draw (ids only) at the drawn token's position as its
 * counter (atlas_model_forward_sample, or _sample_queue when queued); draw NULL: greedy. */
atlas_status decode_run(atlas_model *m, const int32_t *prompt, int n, const int32_t *table,
                        int block_size, int steps, int queued, const atlas_sample_row *draw,
                        int32_t *ids);

#endif
