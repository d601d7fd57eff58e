/* parallel/tp.h — the start-up of tensor parallelism on every rank, on top of rank.h and
 * nccl.h: bind the process host to the rank's GPU, load NCCL, join the communicator; and the
 * worker's main loop.  Internal.
 *
 * Lead (rank 0), after atlas_rank_group_start and before touching CUDA itself:
 *     atlas_tp_rank tp;
 *     atlas_tp_lead_start(group, NULL, 60000, &tp);   // INIT all, bind self, collect;
 *                                                     // id, JOIN all, join self, collect
 *     ... the engine; tp.comm for the all-reduces ...
 *     atlas_tp_rank_close(&tp); atlas_rank_group_close(group, 10000);
 * Worker (the CLI's hidden subcommand):
 *     int fd, rank; atlas_rank_worker_env(&fd, &rank);
 *     return atlas_tp_worker_serve(fd, NULL, model_handler, &state) == ATLAS_OK ? 0 : 1;
 * INIT binds before anyone joins, so a rank whose GPU or NCCL is missing is reported by name
 * before the others block inside ncclCommInitRank. */
#ifndef ATLAS_PARALLEL_TP_H
#define ATLAS_PARALLEL_TP_H

#include "atlas/host.h"
#include "parallel/nccl.h"
#include "parallel/rank.h"

/* One rank's share of tensor parallelism. */
typedef struct atlas_tp_rank {
    int world, rank, ordinal;
    atlas_host *host;      /* the process host, bound to ordinal (never freed) */
    atlas_nccl *nccl;
    atlas_nccl_comm *comm; /* NULL until joined */
} atlas_tp_rank;

typedef struct atlas_tp_options {
    const char *nccl_path;            /* NULL: atlas_nccl_open's default */
    const atlas_nccl_fns *nccl_table; /* instead of loading NCCL (tests: a fake) */
    /* binds the process to a GPU; NULL: atlas_host_get (tests without a GPU: a stand-in) */
    atlas_status (*bind)(int ordinal, atlas_host **out);
} atlas_tp_options;

/* Binds this process as `rank` on GPU `ordinal` and loads NCCL (o NULL: defaults). On failure
 * *out holds nothing to close. */
atlas_status atlas_tp_bind(int world, int rank, int ordinal, const atlas_tp_options *o,
                           atlas_tp_rank *out);
/* Joins the communicator (blocks until every rank has joined). */
atlas_status atlas_tp_join(atlas_tp_rank *r, const atlas_nccl_id *id);
/* Destroys the communicator and unloads NCCL; the host stays. Reports every failure. A zeroed
 * struct is fine. */
atlas_status atlas_tp_rank_close(atlas_tp_rank *r);

/* The lead's start-up over a started group (see above). On failure *out is closed, every
 * rank's error is in the message, and the caller closes the group (workers that did bind
 * or join are stopped with it). */
atlas_status atlas_tp_lead_start(atlas_rank_group *g, const atlas_tp_options *o, int timeout_ms,
                                 atlas_tp_rank *out);

/* Handles the commands after INIT/JOIN (LOAD, FORWARD, RELEASE) with this rank's state. */
typedef atlas_status (*atlas_tp_handler)(void *user, atlas_tp_rank *tp, const atlas_rank_msg *cmd,
                                         char *note, size_t cap);

/* A worker's main loop: INIT and JOIN are handled here, the rest by next (NULL: those
 * commands fail with ATLAS_ERR_UNSUPPORTED). Returns when the lead says QUIT (ATLAS_OK) or
 * goes away (ATLAS_ERR_IO), after closing this rank's communicator and NCCL. */
atlas_status atlas_tp_worker_serve(int fd, const atlas_tp_options *o, atlas_tp_handler next,
                                   void *user);

#endif
