/* backend/cpu/cpu_moe.c — the mixture-of-experts ops (backend.h: moe_route, moe_experts).
 *
 * Routing: the router's logits (with its bias, gpt-oss) through the CPU matmul in fp32 (also
 * when the backend rounds other activations to bf16, as the GPU's router does), a float32 softmax over all experts, then the k largest probabilities
 * picked one at a time by a scan in increasing expert index that only a strictly larger
 * value displaces, so an equal probability keeps the lower index (what torch.topk gives on
 * CPU and GPU for the sizes a router has). gpt-oss's order picks the k largest logits the
 * same way first, then takes the softmax of those k as their weights.
 *
 * Experts: the rows are grouped by expert, and each expert's group goes through the CPU
 * matmul on that expert's view of the stacked weights (its block of whole parts), MOE_ROWS
 * rows at a time so that the buffers stay small whatever the batch: gate|up, the gated
 * activation, down, then each row's result times its routing weight is added to its
 * token's output. Experts run in increasing index, so each token's sum has one order
 * whatever the batch, and the matmul gives each row the same bits alone or batched. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"

enum { MOE_ROWS = 64 }; /* rows of one expert's group multiplied at once */

static atlas_status grow_buf(cpu_backend *cb, size_t floats) {
    if (floats <= cb->moe_cap) return ATLAS_OK;
    float *p = realloc(cb->moe_buf, floats * sizeof *p);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "cpu moe: %zu floats of scratch", floats);
    cb->moe_buf = p;
    cb->moe_cap = floats;
    return ATLAS_OK;
}

static atlas_status grow_list(cpu_backend *cb, size_t n) {
    if (n <= cb->moe_list_cap) return ATLAS_OK;
    int32_t *p = realloc(cb->moe_list, n * sizeof *p);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "cpu moe: routing lists of %zu entries", n);
    cb->moe_list = p;
    cb->moe_list_cap = n;
    return ATLAS_OK;
}

/* The k largest of p[E] into ids/wts in decreasing order, ties to the lower index. */
static void top_k(const float *p, int E, int k, int norm, int32_t *ids, float *wts) {
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++) taken = ids[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[j] = best;
        wts[j] = p[best];
        sum += p[best];
    }
    if (!norm) return;
    for (int j = 0; j < k; j++) wts[j] /= sum;
}

/* The k largest logits, then their softmax over the k (the first is the largest). */
static void top_k_softmax(const float *logits, int E, int k, int32_t *ids, float *wts) {
    top_k(logits, E, k, 0, ids, wts);
    float mx = wts[0], sum = 0.0f;
    for (int j = 0; j < k; j++) sum += (wts[j] = expf(wts[j] - mx));
    for (int j = 0; j < k; j++) wts[j] /= sum;
}

atlas_status cpu_moe_route(atlas_backend *be, int32_t *ids, float *wts, const void *h,
                           const atlas_weight *router, const atlas_weight *bias, int n) {
    cpu_backend *cb = (cpu_backend *)be;
    const atlas_backend_geom *g = &be->geom;
    int E = g->n_experts, k = g->n_experts_used;
    if (E < 1 || router->n_dims != 2 || router->rows != E || router->cols != g->hidden)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu moe_route: a router of [%lld, %lld] for %d "
                          "experts of hidden %d", (long long)router->rows,
                          (long long)router->cols, E, g->hidden);
    ATLAS_TRY(grow_buf(cb, (size_t)n * E));
    float *logits = cb->moe_buf;
    ATLAS_TRY(cpu_matmul_exact(be, logits, h, router, bias, n));
    for (int t = 0; t < n; t++) {
        if (g->moe_route == ATLAS_ROUTE_TOPK_SOFTMAX) {
            top_k_softmax(logits + (size_t)t * E, E, k, ids + (size_t)t * k, wts + (size_t)t * k);
            continue;
        }
        float *p = logits + (size_t)t * E, max = p[0], sum = 0.0f;
        for (int e = 1; e < E; e++) max = p[e] > max ? p[e] : max;
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - max));
        for (int e = 0; e < E; e++) p[e] /= sum;
        top_k(p, E, k, g->moe_norm_topk, ids + (size_t)t * k, wts + (size_t)t * k);
    }
    return ATLAS_OK;
}

/* The view of rows [r0, r0 + rows) of w, which must be whole parts of it (a stacked
 * expert weight's block): v points into w's parts, with row0 rebased into parts[cap]. */
static atlas_status view_rows(const atlas_weight *w, int64_t r0, int64_t rows, cpu_part *parts,
                              int cap, atlas_weight *v) {
    int lo = 0, hi = w->n_parts; /* the first part that ends past r0 */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (w->parts[mid].row0 + w->parts[mid].rows <= r0) lo = mid + 1;
        else hi = mid;
    }
    *v = (atlas_weight){.n_dims = 2, .rows = rows, .cols = w->cols, .parts = parts};
    int64_t at = r0;
    for (int p = lo; p < w->n_parts && at < r0 + rows; p++) {
        const cpu_part *src = &w->parts[p];
        if (src->row0 != at || src->row0 + src->rows > r0 + rows || v->n_parts == cap)
            return atlas_fail(ATLAS_ERR_INTERNAL, "cpu moe: rows %lld..%lld of a stacked "
                              "weight are not whole parts of it", (long long)r0,
                              (long long)(r0 + rows));
        parts[v->n_parts] = *src;
        parts[v->n_parts++].row0 = at - r0;
        at += src->rows;
    }
    if (at != r0 + rows)
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu moe: rows %lld..%lld past the stacked "
                          "weight's %lld", (long long)r0, (long long)(r0 + rows),
                          (long long)w->rows);
    return ATLAS_OK;
}

typedef struct moe_group {
    const float *h;
    float *out;
    const float *wts;
    int k, d, f;
} moe_group;

/* Expert e's slice of a stacked bias [E * rows] (NULL: none), as a 1-D weight view. */
static const atlas_weight *bias_view(const atlas_weight *b, int e, int64_t rows,
                                     atlas_weight *v) {
    if (!b) return NULL;
    *v = (atlas_weight){.n_dims = 1, .rows = 1, .cols = rows, .vec = b->vec + e * rows};
    return v;
}

/* One expert's rows list[0 .. cnt) (each t * k + j: token t's j-th choice), MOE_ROWS at a
 * time, through its views gu and dn; buf holds [MOE_ROWS, d + 2f + f + d]. */
static atlas_status run_expert(atlas_backend *be, const moe_group *m, const atlas_weight *gu,
                               const atlas_weight *gu_bias, const atlas_weight *dn,
                               const atlas_weight *dn_bias, const int32_t *list, int cnt,
                               float *buf) {
    int d = m->d, f = m->f;
    float *xg = buf, *gate_up = xg + (size_t)MOE_ROWS * d, *act = gate_up + (size_t)MOE_ROWS * 2 * f,
          *y = act + (size_t)MOE_ROWS * f;
    for (int i0 = 0; i0 < cnt; i0 += MOE_ROWS) {
        int nb = cnt - i0 < MOE_ROWS ? cnt - i0 : MOE_ROWS;
        for (int i = 0; i < nb; i++)
            memcpy(xg + (size_t)i * d, m->h + (size_t)(list[i0 + i] / m->k) * d,
                   (size_t)d * sizeof *xg);
        ATLAS_TRY(cpu_matmul(be, gate_up, xg, gu, gu_bias, nb));
        ATLAS_TRY(cpu_glu(be, act, gate_up, nb, f));
        ATLAS_TRY(cpu_matmul(be, y, act, dn, dn_bias, nb));
        for (int i = 0; i < nb; i++) {
            int slot = list[i0 + i];
            float w = m->wts[slot], *o = m->out + (size_t)(slot / m->k) * d;
            const float *yr = y + (size_t)i * d;
            for (int c = 0; c < d; c++) o[c] += yr[c] * w;
        }
    }
    return ATLAS_OK;
}

static atlas_status check_experts(const atlas_backend_geom *g, const atlas_weight *gate_up,
                                  const atlas_weight *gu_bias, const atlas_weight *down,
                                  const atlas_weight *dn_bias) {
    int64_t E = g->n_experts, f = g->expert_ffn, d = g->hidden;
    if ((gu_bias && (gu_bias->n_dims != 1 || gu_bias->cols != E * 2 * f)) ||
        (dn_bias && (dn_bias->n_dims != 1 || dn_bias->cols != E * d)))
        return atlas_fail(ATLAS_ERR_INTERNAL, "cpu moe_experts: biases of %lld and %lld for "
                          "%lld experts of [%lld, %lld]", gu_bias ? (long long)gu_bias->cols : 0,
                          dn_bias ? (long long)dn_bias->cols : 0, (long long)E, (long long)f,
                          (long long)d);
    if (E > 0 && gate_up->n_dims == 2 && down->n_dims == 2 && gate_up->rows == E * 2 * f &&
        gate_up->cols == d && down->rows == E * d && down->cols == f)
        return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_INTERNAL, "cpu moe_experts: weights [%lld, %lld] and [%lld, "
                      "%lld] for %lld experts of [%lld, %lld]", (long long)gate_up->rows,
                      (long long)gate_up->cols, (long long)down->rows, (long long)down->cols,
                      (long long)E, (long long)f, (long long)d);
}

atlas_status cpu_moe_experts(atlas_backend *be, void *out, const void *h,
                             const atlas_weight *gate_up, const atlas_weight *gate_up_bias,
                             const atlas_weight *down, const atlas_weight *down_bias,
                             const int32_t *ids, const float *wts, int n) {
    cpu_backend *cb = (cpu_backend *)be;
    const atlas_backend_geom *g = &be->geom;
    int E = g->n_experts, k = g->n_experts_used, d = g->hidden, f = g->expert_ffn;
    ATLAS_TRY(check_experts(g, gate_up, gate_up_bias, down, down_bias));
    size_t slots = (size_t)n * k;
    for (size_t s = 0; s < slots; s++)
        if (ids[s] < 0 || ids[s] >= E)
            return atlas_fail(ATLAS_ERR_INTERNAL, "cpu moe_experts: token %zu routed to expert "
                              "%d of %d", s / k, ids[s], E);
    /* list: the slots grouped by expert (a counting sort, tokens in order), start[E + 1] */
    ATLAS_TRY(grow_list(cb, slots + E + 1));
    ATLAS_TRY(grow_buf(cb, (size_t)MOE_ROWS * (2 * d + 3 * (size_t)f)));
    int32_t *list = cb->moe_list, *start = list + slots;
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (size_t s = 0; s < slots; s++) start[ids[s] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (size_t s = 0; s < slots; s++) list[start[ids[s]]++] = (int32_t)s;
    for (int e = E; e > 0; e--) start[e] = start[e - 1]; /* back to each group's first */
    start[0] = 0;
    memset(out, 0, (size_t)n * d * sizeof(float));
    moe_group m = {.h = h, .out = out, .wts = wts, .k = k, .d = d, .f = f};
    cpu_part gp[8], dp[8];
    for (int e = 0; e < E; e++) {
        int cnt = start[e + 1] - start[e];
        if (cnt == 0) continue;
        atlas_weight gu, dn, gub, dnb;
        ATLAS_TRY(view_rows(gate_up, (int64_t)e * 2 * f, 2 * (int64_t)f, gp, 8, &gu));
        ATLAS_TRY(view_rows(down, (int64_t)e * d, d, dp, 8, &dn));
        ATLAS_TRY(run_expert(be, &m, &gu, bias_view(gate_up_bias, e, 2 * (int64_t)f, &gub), &dn,
                             bias_view(down_bias, e, d, &dnb), list + start[e], cnt,
                             cb->moe_buf));
    }
    return ATLAS_OK;
}
