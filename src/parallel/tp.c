/* parallel/tp.c — tensor-parallel start-up on every rank; see tp.h. */
#include "parallel/tp.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

atlas_status atlas_tp_bind(int world, int rank, int ordinal, const atlas_tp_options *o,
                           atlas_tp_rank *out) {
    static const atlas_tp_options defaults = {0};
    if (!o) o = &defaults;
    memset(out, 0, sizeof *out);
    if (world < 1 || rank < 0 || rank >= world || ordinal < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "tensor parallel: rank %d of %d on GPU %d", rank,
                          world, ordinal);
    atlas_host *host = NULL;
    atlas_status st = o->bind ? o->bind(ordinal, &host) : atlas_host_get(ordinal, &host);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "GPU %d", ordinal);
    atlas_nccl *nccl = NULL;
    st = o->nccl_table ? atlas_nccl_open_table(o->nccl_table, &nccl)
                       : atlas_nccl_open(o->nccl_path, &nccl);
    if (st != ATLAS_OK) return st;
    *out = (atlas_tp_rank){world, rank, ordinal, host, nccl, NULL};
    return ATLAS_OK;
}

atlas_status atlas_tp_join(atlas_tp_rank *r, const atlas_nccl_id *id) {
    if (!r->nccl || r->comm)
        return atlas_fail(ATLAS_ERR_INVALID, "rank %d: JOIN %s", r->rank,
                          r->comm ? "twice" : "before INIT");
    return atlas_nccl_comm_init(r->nccl, r->world, r->rank, id, &r->comm);
}

atlas_status atlas_tp_rank_close(atlas_tp_rank *r) {
    char why[1024] = "";
    atlas_status first = ATLAS_OK, st;
    if ((st = atlas_nccl_comm_destroy(r->comm)) != ATLAS_OK) {
        first = st;
        snprintf(why, sizeof why, "%s", atlas_last_error());
    }
    r->comm = NULL;
    if ((st = atlas_nccl_close(r->nccl)) != ATLAS_OK) {
        if (first == ATLAS_OK) first = st;
        size_t len = strlen(why);
        snprintf(why + len, sizeof why - len, "%s%s", len ? "; " : "", atlas_last_error());
    }
    r->nccl = NULL;
    if (first != ATLAS_OK) return atlas_fail(first, "rank %d: closing: %s", r->rank, why);
    return ATLAS_OK;
}

/* The workers' replies to a posted command, after the lead's own part returned `own`: the
 * lead's error first ("rank 0: ..."), then the workers' ("rank 1: ..."). */
static atlas_status collect_after(atlas_rank_group *g, atlas_status own, int timeout_ms) {
    char mine[1024] = "";
    if (own != ATLAS_OK) snprintf(mine, sizeof mine, "rank 0: %s", atlas_last_error());
    atlas_status st = atlas_rank_group_collect(g, timeout_ms);
    if (own == ATLAS_OK) return st;
    if (st == ATLAS_OK) return atlas_fail(own, "%s", mine);
    char theirs[1024];
    snprintf(theirs, sizeof theirs, "%s", atlas_last_error());
    return atlas_fail(own, "%s; %s", mine, theirs);
}

atlas_status atlas_tp_lead_start(atlas_rank_group *g, const atlas_tp_options *o, int timeout_ms,
                                 atlas_tp_rank *out) {
    memset(out, 0, sizeof *out);
    int world = atlas_rank_group_world(g);
    /* 1. every rank binds its GPU and loads NCCL; nobody blocks yet */
    ATLAS_TRY(atlas_rank_group_post_init(g, timeout_ms));
    atlas_status own = atlas_tp_bind(world, 0, atlas_rank_group_ordinal(g, 0), o, out);
    atlas_status st = collect_after(g, own, timeout_ms);
    if (st != ATLAS_OK) goto fail;
    /* 2. all bound: the id goes out and every rank joins (ncclCommInitRank meets inside) */
    atlas_nccl_id id;
    if ((st = atlas_nccl_unique_id(out->nccl, &id)) != ATLAS_OK) goto fail;
    if ((st = atlas_rank_group_post(g, ATLAS_RANK_CMD_JOIN, id.bytes, sizeof id.bytes,
                                    timeout_ms)) != ATLAS_OK)
        goto fail;
    st = collect_after(g, atlas_tp_join(out, &id), timeout_ms);
    if (st != ATLAS_OK) goto fail;
    return ATLAS_OK;
fail: {
        char why[2048];
        snprintf(why, sizeof why, "%s", atlas_last_error());
        atlas_tp_rank_close(out); /* its own error, if any, matters less than why */
        return atlas_fail(st, "tensor parallel start-up (%d ranks): %s", world, why);
    }
}

typedef struct worker_state {
    const atlas_tp_options *o;
    atlas_tp_rank tp;
    atlas_tp_handler next;
    void *user;
} worker_state;

static atlas_status worker_handle(void *user, const atlas_rank_msg *m, char *note, size_t cap) {
    worker_state *w = user;
    if (m->type == ATLAS_RANK_CMD_INIT) {
        if (w->tp.nccl) return atlas_fail(ATLAS_ERR_INVALID, "rank %d: INIT twice", w->tp.rank);
        atlas_rank_init in;
        ATLAS_TRY(atlas_rank_init_decode(m->payload, m->len, &in));
        ATLAS_TRY(atlas_tp_bind(in.world, in.rank, in.ordinal, w->o, &w->tp));
        snprintf(note, cap, "rank %d of %d on GPU %d, NCCL %d", in.rank, in.world, in.ordinal,
                 atlas_nccl_version(w->tp.nccl));
        return ATLAS_OK;
    }
    if (m->type == ATLAS_RANK_CMD_JOIN) {
        if (m->len != ATLAS_NCCL_ID_BYTES)
            return atlas_fail(ATLAS_ERR_FORMAT, "rank JOIN: payload of %u bytes, want %d", m->len,
                              (int)ATLAS_NCCL_ID_BYTES);
        atlas_nccl_id id;
        memcpy(id.bytes, m->payload, sizeof id.bytes);
        ATLAS_TRY(atlas_tp_join(&w->tp, &id));
        snprintf(note, cap, "rank %d joined", w->tp.rank);
        return ATLAS_OK;
    }
    if (!w->tp.comm)
        return atlas_fail(ATLAS_ERR_INVALID, "rank worker: %s before INIT and JOIN",
                          atlas_rank_cmd_name(m->type));
    if (!w->next)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "rank %d: %s is not wired in this worker",
                          w->tp.rank, atlas_rank_cmd_name(m->type));
    return w->next(w->user, &w->tp, m, note, cap);
}

atlas_status atlas_tp_worker_serve(int fd, const atlas_tp_options *o, atlas_tp_handler next,
                                   void *user) {
    worker_state w = {o, {0}, next, user};
    atlas_status st = atlas_rank_worker_serve(fd, worker_handle, &w);
    char why[1024];
    snprintf(why, sizeof why, "%s", atlas_last_error());
    atlas_status closed = atlas_tp_rank_close(&w.tp);
    if (st != ATLAS_OK) return atlas_fail(st, "%s", why);
    return closed;
}
