/* tests/greedy.c — see greedy.h. */
#include "greedy.h"

#include <stdlib.h>

#include "model/forward.h"

/* One batch of n tokens of the sequence from position *ctx (tokens NULL: the queued step's
 * ids); *ctx moves past them when it ran or was queued. */
static atlas_status step(atlas_model *m, const int32_t *tokens, int n, int *ctx,
                         const int32_t *table, int block_size, int queue, int32_t *id) {
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    if (!pos) return ATLAS_ERR_NOMEM;
    for (int i = 0; i < n; i++) pos[i] = *ctx + i;
    int32_t start[2] = {0, n}, end = *ctx + n, row = n - 1;
    atlas_batch b = {.n_tokens = n, .tokens = tokens, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &end, .block_table = table,
                     .max_blocks = (end + block_size - 1) / block_size, .n_logits = 1,
                     .logit_rows = &row};
    atlas_status st = queue ? atlas_model_forward_argmax_queue(m, &b)
                            : atlas_model_forward_argmax(m, &b, id);
    free(pos);
    if (st == ATLAS_OK) *ctx = end;
    return st;
}

atlas_status greedy_run(atlas_model *m, const int32_t *prompt, int n, const int32_t *table,
                        int block_size, int steps, int queued, int32_t *ids) {
    int ctx = 0;
    atlas_status st = step(m, prompt, n, &ctx, table, block_size, 0, &ids[0]);
    if (!queued) {
        for (int i = 1; i < steps && st == ATLAS_OK; i++)
            st = step(m, &ids[i - 1], 1, &ctx, table, block_size, 0, &ids[i]);
        return st;
    }
    if (st == ATLAS_OK && steps > 1) st = step(m, &ids[0], 1, &ctx, table, block_size, 1, NULL);
    for (int i = 1; i < steps && st == ATLAS_OK; i++) {
        if (i + 1 < steps) st = step(m, NULL, 1, &ctx, table, block_size, 1, NULL);
        atlas_status c = atlas_model_argmax_collect(m, &ids[i], 1);
        if (st == ATLAS_OK) st = c;
    }
    return st;
}
