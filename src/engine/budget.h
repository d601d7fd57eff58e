/* engine/budget.h — what a step's tokens cost, so that a long prompt's chunks deep in its
 * context take less of a step than its first ones.  Internal.
 *
 * A step's budget (batch_tokens) counts tokens as the matmuls see them: each token costs
 * 2 x its active parameters in FLOPs whatever its position.  A prompt token at position p
 * also attends over p keys, 4 x heads x head_dim FLOPs a key and a layer (q.k and the
 * weighted sum of v), which at 32k tokens on an 8B model is as much again as its matmuls:
 * counted in tokens alone, the chunks of a long prompt make ever slower steps, and the
 * decodes that share them wait.  A chunk's cost is its tokens plus their attention over the
 * keys before the chunk, in the same unit (sliding-window layers attend over at most their
 * window), so that a chunk from position 0 costs its tokens, as the budget always counted. */
#ifndef ATLAS_ENGINE_BUDGET_H
#define ATLAS_ENGINE_BUDGET_H

#include "model/config.h"

typedef struct atlas_step_cost {
    double full;   /* a token's attention over one key in its full-attention layers, in
                      tokens (its matmuls' FLOPs are 1) */
    double window; /* the same for its sliding-window layers */
    int sliding_window;
} atlas_step_cost;

/* The costs of cfg's model (its geometry; the experts a token uses, not all of them). */
void atlas_step_cost_init(atlas_step_cost *c, const atlas_config *cfg);

/* What n tokens of a chunk from position p cost, in tokens. */
double atlas_step_cost_of(const atlas_step_cost *c, int p, int n);

/* The most tokens, at most n, of a chunk from position p whose cost fits in budget; 0 when
 * not even one does. */
int atlas_step_cost_take(const atlas_step_cost *c, int p, int n, double budget);

#endif
