/* backend/cuda/plan.c — how recorded commands run: the batch's queue, the exec list (each
 * command through ops_cuda.c, fusing neighbours) and the CUDA graphs of decode steps; the
 * state is cuda_backend.plan (cuda_backend.h, with the command scheme). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

/* --- the queue -------------------------------------------------------------------------------- */

/* One command now: the mixture-of-experts ones are ops_moe.c's, the rest ops_cuda.c's. */
static atlas_status exec_one(cuda_backend *cb, const cuda_cmd *c) {
    if (c->op == CUDA_OP_MOE_ROUTE || c->op == CUDA_OP_MOE_EXPERTS) return cuda_moe_exec(cb, c);
    return cuda_exec(cb, c);
}

/* Inside a batch (deferring) the command waits in the queue for the next flush. */
atlas_status cuda_submit(cuda_backend *cb, const cuda_cmd *c) {
    ATLAS_TRY(cuda_serving(cb)); /* ops run on the serving stream: after the load's work */
    if (!cb->plan.deferring) return exec_one(cb, c);
    if (cb->plan.n_queue == cb->plan.cap_queue) {
        int cap = cb->plan.cap_queue ? cb->plan.cap_queue * 2 : 256;
        cuda_cmd *q = realloc(cb->plan.queue, (size_t)cap * sizeof *q);
        if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
        cb->plan.queue = q;
        cb->plan.cap_queue = cap;
    }
    cb->plan.queue[cb->plan.n_queue++] = *c;
    return ATLAS_OK;
}

atlas_status cuda_cmd_linked(cuda_backend *cb, int op, int n, int d, int layer, int link,
                             int row0, const void *p0, const void *p1, const void *p2,
                             const void *p3) {
    cuda_cmd c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.n = n;
    c.d = d;
    c.layer = layer;
    c.link = link;
    c.row0 = row0;
    c.p[0] = p0; c.p[1] = p1; c.p[2] = p2; c.p[3] = p3;
    return cuda_submit(cb, &c);
}

atlas_status cuda_cmd4(cuda_backend *cb, int op, int n, int d, int layer, const void *p0,
                       const void *p1, const void *p2, const void *p3) {
    return cuda_cmd_linked(cb, op, n, d, layer, 0, 0, p0, p1, p2, p3);
}

/* --- the exec list ---------------------------------------------------------------------------- */

atlas_status cuda_exec_list(cuda_backend *cb, const cuda_cmd *c, int n) {
    atlas_status st = ATLAS_OK;
    cb->plan.mirror_rows = 0; /* a list (and so a graph) never relies on an earlier one's copy */
    for (int i = 0; i < n && st == ATLAS_OK;) {
        if (cb->plan.skip_ops & (1u << c[i].op)) { /* skip_ops: timing only */
            if (c[i].op == CUDA_OP_ADD_RMSNORM) cb->plan.mirror_rows = 0; /* no copy made */
            i++;
            continue;
        }
        if (c[i].op == CUDA_OP_MOE_ROUTE || c[i].op == CUDA_OP_MOE_EXPERTS) { /* no fusions */
            st = exec_one(cb, &c[i++]);
            continue;
        }
        i += cuda_exec_fused(cb, c + i, n - i, &st);
    }
    return st;
}

/* --- graphs ----------------------------------------------------------------------------------- */

void cuda_plan_drop_graphs(cuda_backend *cb) {
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++) {
        if (cb->plan.graphs[i].exec) /* a failure: the registry's release reports it */
            ATLAS_REGISTRY_KEEP(cb->mod.reg, "decode graph", cuGraphExecDestroy,
                                cb->plan.graphs[i].exec);
        free(cb->plan.graphs[i].cmds);
        memset(&cb->plan.graphs[i], 0, sizeof cb->plan.graphs[i]);
    }
}

static atlas_status capture(cuda_backend *cb, cuda_graph *slot) {
    const atlas_driver *d = atlas_driver_get();
    ATLAS_CU_TRY(cuStreamBeginCapture, cb->dev.stream,
                 ATLAS_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    atlas_status st = cuda_exec_list(cb, cb->plan.queue, cb->plan.n_queue);
    CUgraph graph = NULL;
    atlas_status end = ATLAS_CU(cuStreamEndCapture, cb->dev.stream, &graph);
    if (st == ATLAS_OK) st = end;
    if (st == ATLAS_OK) st = ATLAS_CU(cuGraphInstantiateWithFlags, &slot->exec, graph, 0);
    if (graph) d->cuGraphDestroy(graph);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "cuda: capturing a decode step");
    slot->cmds = malloc((size_t)cb->plan.n_queue * sizeof *slot->cmds);
    if (!slot->cmds) {
        d->cuGraphExecDestroy(slot->exec);
        slot->exec = NULL;
        return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    }
    memcpy(slot->cmds, cb->plan.queue, (size_t)cb->plan.n_queue * sizeof *slot->cmds);
    slot->n_cmds = cb->plan.n_queue;
    cb->plan.graph_captures++;
    return ATLAS_OK;
}

/* Runs the queued commands: a prefill's as they are, a decode step's as the graph recorded
 * for the same list, or a new one. */
atlas_status cuda_flush(cuda_backend *cb) {
    if (cb->plan.n_queue == 0) return ATLAS_OK;
    if (!cb->plan.graphing) {
        int n = cb->plan.n_queue;
        cb->plan.n_queue = 0;
        return cuda_exec_list(cb, cb->plan.queue, n);
    }
    cuda_graph *hit = NULL, *lru = &cb->plan.graphs[0];
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++) {
        cuda_graph *g = &cb->plan.graphs[i];
        if (g->exec && g->n_cmds == cb->plan.n_queue &&
            !memcmp(g->cmds, cb->plan.queue,
                    (size_t)cb->plan.n_queue * sizeof *cb->plan.queue)) {
            hit = g;
            break;
        }
        if (!g->exec || (lru->exec && g->last_use < lru->last_use)) lru = g;
    }
    if (!hit) {
        if (lru->exec) atlas_driver_get()->cuGraphExecDestroy(lru->exec);
        free(lru->cmds);
        memset(lru, 0, sizeof *lru);
        atlas_status st = capture(cb, lru);
        if (st != ATLAS_OK) {
            cb->plan.n_queue = 0;
            return st;
        }
        hit = lru;
    } else {
        cb->plan.graph_replays++;
    }
    hit->last_use = ++cb->plan.clock;
    cb->plan.n_queue = 0;
    return ATLAS_CU(cuGraphLaunch, hit->exec, cb->dev.stream);
}

void cuda_plan_release(cuda_backend *cb) {
    if (cb->mod.reg) cuda_plan_drop_graphs(cb);
    free(cb->plan.queue);
}
