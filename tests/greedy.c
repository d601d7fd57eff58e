/* tests/greedy.c — see greedy.h. */
#include "greedy.h"

#include <stdlib.h>

#include "model/forward.h"

/* One batch of n tokens of the sequence from position *ctx (a queued step's token may be
 * ATLAS_BATCH_PREV(0): the id of the step queued before); *ctx moves past them when it ran
 * or was queued. draw NULL: the argmax; else the draw of *draw at the drawn token's
 * position. */
static atlas_status step(atlas_model *m, const int32_t *tokens, int n, int *ctx,
                         const int32_t *table, int block_size, int queue,
                         const atlas_sample_row *draw, int32_t *id) {
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    if (!pos) return ATLAS_ERR_NOMEM;
    for (int i = 0; i < n; i++) pos[i] = *ctx + i;
    int32_t start[2] = {0, n}, end = *ctx + n, row = n - 1;
    atlas_batch b = {.n_tokens = n, .tokens = tokens, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &end, .block_table = table,
                     .max_blocks = (end + block_size - 1) / block_size, .n_logits = 1,
                     .logit_rows = &row};
    atlas_sample_row r;
    if (draw) {
        r = *draw;
        r.counter = (uint64_t)end;
    }
    atlas_sample_out out;
    atlas_model_sampling smp = {.rows = &r, .out = &out};
    atlas_status st;
    if (queue)
        st = draw ? atlas_model_forward_sample_queue(m, &b, &r)
                  : atlas_model_forward_argmax_queue(m, &b);
    else if (draw)
        st = atlas_model_forward_sample(m, &b, &smp);
    else
        st = atlas_model_forward_argmax(m, &b, id);
    if (st == ATLAS_OK && draw && !queue) *id = out.id;
    free(pos);
    if (st == ATLAS_OK) *ctx = end;
    return st;
}

atlas_status decode_run(atlas_model *m, const int32_t *prompt, int n, const int32_t *table,
                        int block_size, int steps, int queued, const atlas_sample_row *draw,
                        int32_t *ids) {
    int ctx = 0;
    atlas_status st = step(m, prompt, n, &ctx, table, block_size, 0, draw, &ids[0]);
    if (!queued) {
        for (int i = 1; i < steps && st == ATLAS_OK; i++)
            st = step(m, &ids[i - 1], 1, &ctx, table, block_size, 0, draw, &ids[i]);
        return st;
    }
    if (st == ATLAS_OK && steps > 1)
        st = step(m, &ids[0], 1, &ctx, table, block_size, 1, draw, NULL);
    const int32_t prev = ATLAS_BATCH_PREV(0);
    for (int i = 1; i < steps && st == ATLAS_OK; i++) {
        if (i + 1 < steps) st = step(m, &prev, 1, &ctx, table, block_size, 1, draw, NULL);
        atlas_status c = atlas_model_argmax_collect(m, &ids[i], 1);
        if (st == ATLAS_OK) st = c;
    }
    return st;
}

atlas_status greedy_run(atlas_model *m, const int32_t *prompt, int n, const int32_t *table,
                        int block_size, int steps, int queued, int32_t *ids) {
    return decode_run(m, prompt, n, table, block_size, steps, queued, NULL, ids);
}
