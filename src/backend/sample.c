/* backend/sample.c — the sample op's argument checks, shared by the backends (backend.h). */
#include <math.h>

#include "backend/backend.h"
#include "core/error.h"

/* Row r's params, as atlas/sampler.h's checks them. */
static atlas_status row_check(const atlas_sample_row *q, int r, int n_adj) {
    if (!(q->temperature >= 0.0f) || !isfinite(q->temperature))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: temperature %g: must be >= 0", r,
                          (double)q->temperature);
    if (q->top_k < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: top_k %d: must be >= 0", r,
                          (int)q->top_k);
    if (!(q->top_p > 0.0f && q->top_p <= 1.0f))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: top_p %g: must be in (0, 1]", r,
                          (double)q->top_p);
    if (!(q->min_p >= 0.0f && q->min_p <= 1.0f))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: min_p %g: must be in [0, 1]", r,
                          (double)q->min_p);
    if (!(q->repetition_penalty > 0.0f) || !isfinite(q->repetition_penalty))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: repetition_penalty %g: must be "
                          "> 0", r, (double)q->repetition_penalty);
    if (!isfinite(q->presence_penalty) || !isfinite(q->frequency_penalty))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: presence/frequency penalty not "
                          "finite", r);
    if (q->n_top < 0 || q->n_top > ATLAS_SAMPLE_MAX_TOP)
        return atlas_fail(ATLAS_ERR_RANGE, "sample: row %d: n_top %d outside 0..%d", r,
                          (int)q->n_top, ATLAS_SAMPLE_MAX_TOP);
    if (q->flags & ~(ATLAS_SAMPLE_LOGPROB | ATLAS_SAMPLE_SKIP))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: flags 0x%x", r, (unsigned)q->flags);
    if (q->adj0 < 0 || q->n_adj < 0 || q->adj0 > n_adj - q->n_adj)
        return atlas_fail(ATLAS_ERR_RANGE, "sample: row %d: adjustments [%d, +%d) outside the "
                          "%d given", r, (int)q->adj0, (int)q->n_adj, n_adj);
    return ATLAS_OK;
}

atlas_status atlas_sample_check(const atlas_sample_row *p, int rows, const atlas_sample_adj *adj,
                                int n_adj, int vocab) {
    if (rows < 0 || vocab <= 0 || n_adj < 0 || (n_adj > 0 && !adj))
        return atlas_fail(ATLAS_ERR_INVALID, "sample: %d rows of %d, %d adjustments", rows,
                          vocab, n_adj);
    int end = 0; /* rows' adjustments follow each other without overlap (CUDA keeps each
                    adjusted logit's raw value beside its entry) */
    for (int r = 0; r < rows; r++) {
        if (p[r].flags & ATLAS_SAMPLE_SKIP) continue;
        ATLAS_TRY(row_check(&p[r], r, n_adj));
        if (p[r].n_adj > 0 && p[r].adj0 < end)
            return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: adjustments from %d overlap "
                              "the rows' before (up to %d)", r, (int)p[r].adj0, end);
        if (p[r].n_adj > 0) end = p[r].adj0 + p[r].n_adj;
        const atlas_sample_adj *a = adj + p[r].adj0;
        for (int j = 0; j < p[r].n_adj; j++) {
            if (a[j].id < 0 || a[j].id >= vocab || (j > 0 && a[j].id <= a[j - 1].id))
                return atlas_fail(ATLAS_ERR_RANGE, "sample: row %d: adjustment %d: id %d (ids "
                                  "increase, each below %d)", r, j, (int)a[j].id, vocab);
            if ((a[j].seen != 0 && a[j].seen != 1) || a[j].count < 0 ||
                (a[j].count > 0 && !a[j].seen) || !isfinite(a[j].bias))
                return atlas_fail(ATLAS_ERR_INVALID, "sample: row %d: adjustment %d (id %d): "
                                  "seen %d, count %d, bias %g", r, j, (int)a[j].id,
                                  (int)a[j].seen, (int)a[j].count, (double)a[j].bias);
        }
    }
    return ATLAS_OK;
}

atlas_status atlas_sample_check_queued(const atlas_sample_row *p, int rows, int vocab) {
    if (rows > 0 && !p)
        return atlas_fail(ATLAS_ERR_INVALID, "sample: %d queued rows, none given", rows);
    ATLAS_TRY(atlas_sample_check(p, rows, NULL, 0, vocab));
    for (int r = 0; r < rows; r++)
        if (p[r].flags || p[r].n_adj || p[r].n_top)
            return atlas_fail(ATLAS_ERR_INVALID, "sample: queued row %d asks for flags 0x%x, "
                              "%d adjustments, %d top ids: a queued step draws ids only", r,
                              (unsigned)p[r].flags, (int)p[r].n_adj, (int)p[r].n_top);
    return ATLAS_OK;
}
