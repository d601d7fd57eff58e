/* parallel/rank.h — the processes of tensor parallelism and how rank 0 drives them.  Internal.
 *
 * One process per GPU (a process's host is bound to one ordinal: see DESIGN.md). The process
 * the user starts is rank 0, the lead: it runs the server, the scheduler and sampling, and
 * starts ranks 1..N-1 as worker processes before it touches CUDA (CUDA does not survive a
 * fork). Each worker gets one end of a socketpair; over it the lead sends commands and the
 * worker answers each with a reply:
 *
 *   INIT     world, rank, GPU ordinal: bind the host to the GPU, load NCCL
 *   JOIN     the NCCL unique id: join the communicator (sent once every rank is bound, so
 *            that a rank that cannot bind is reported before the others block in NCCL)
 *   LOAD     a model directory: load this rank's shard (model/shard.h)
 *   FORWARD  a batch (atlas_batch, encoded below): run the layers; the all-reduces meet
 *            rank 0's inside NCCL; logits stay on rank 0
 *   RELEASE  release the model (the live-handle check runs on every rank)
 *   QUIT     reply, then exit
 *
 * Frames (both directions; native byte order: both ends are the same binary on one host):
 *   byte 0   u32 magic 0x31505441 ("ATP1")
 *        4   u32 type: a command, or ATLAS_RANK_REPLY
 *        8   u32 seq: the lead numbers commands; a reply repeats its command's seq
 *       12   u32 payload bytes (<= ATLAS_RANK_MAX_PAYLOAD)
 *       16   payload
 * A reply's payload is i32 status (ATLAS_OK or an atlas_status) then a UTF-8 note: the
 * worker's error message, or what it did ("loaded 7.5 GiB").
 *
 * Failure is reported, never waited out: every wait has a deadline; a worker that exits, is
 * killed or closes its socket is reported at once with its exit status or signal, and the
 * group is then broken (tensor parallelism cannot go on without a rank): later calls fail at
 * once and the lead closes the group. Workers die with the lead (PR_SET_PDEATHSIG: it fires
 * when the thread that forked exits, so start the group from the main thread) and leave
 * their serve loop when its socket closes. Writes use MSG_NOSIGNAL: a dead worker is an
 * error, not a SIGPIPE. */
#ifndef ATLAS_PARALLEL_RANK_H
#define ATLAS_PARALLEL_RANK_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "backend/backend.h"
#include "parallel/nccl.h"

#define ATLAS_RANK_MAGIC 0x31505441u
#define ATLAS_RANK_MAX_PAYLOAD (64u << 20)
#define ATLAS_RANK_MAX_WORLD 64

typedef enum atlas_rank_cmd {
    ATLAS_RANK_CMD_INIT = 1,
    ATLAS_RANK_CMD_LOAD = 2,
    ATLAS_RANK_CMD_FORWARD = 3,
    ATLAS_RANK_CMD_RELEASE = 4,
    ATLAS_RANK_CMD_QUIT = 5,
    ATLAS_RANK_CMD_JOIN = 6,
    ATLAS_RANK_REPLY = 100,
} atlas_rank_cmd;

/* "INIT", "LOAD", ... "JOIN", "REPLY", "?" */
const char *atlas_rank_cmd_name(uint32_t type);

/* One frame as received. payload is malloc'd with a NUL after its len bytes. */
typedef struct atlas_rank_msg {
    uint32_t type;
    uint32_t seq;
    uint32_t len;
    unsigned char *payload;
} atlas_rank_msg;

void atlas_rank_msg_free(atlas_rank_msg *msg); /* frees the payload; the struct is the caller's */

/* --- frames over one socket (both sides) --------------------------------------------------- */

/* timeout_ms < 0: no deadline. ATLAS_ERR_IO when the peer closed or the deadline passed,
 * ATLAS_ERR_FORMAT for a bad magic or a payload over the limit (with the byte offset). */
atlas_status atlas_rank_send(int fd, uint32_t type, uint32_t seq, const void *payload,
                             size_t len, int timeout_ms);
atlas_status atlas_rank_recv(int fd, int timeout_ms, atlas_rank_msg *out);

/* --- payloads ------------------------------------------------------------------------------ */

typedef struct atlas_rank_init {
    int32_t world, rank, ordinal;
} atlas_rank_init;

enum { ATLAS_RANK_INIT_BYTES = 12 }; /* JOIN's payload is the ATLAS_NCCL_ID_BYTES of the id */

void atlas_rank_init_encode(const atlas_rank_init *in, unsigned char out[ATLAS_RANK_INIT_BYTES]);
atlas_status atlas_rank_init_decode(const void *buf, size_t len, atlas_rank_init *out);

/* A batch as i32 n_tokens, n_seqs, max_blocks, n_logits, then tokens[n_tokens],
 * positions[n_tokens], seq_start[n_seqs + 1], seq_ctx[n_seqs], block_table[n_seqs *
 * max_blocks], logit_rows[n_logits]. encode mallocs *out. decode checks the counts and the
 * length (errors name the field and byte offset) and points the batch's arrays into buf,
 * which must be 4-byte aligned and outlive the batch; the semantic checks stay
 * atlas_model_forward's. */
atlas_status atlas_rank_batch_encode(const atlas_batch *b, void **out, size_t *len);
atlas_status atlas_rank_batch_decode(const void *buf, size_t len, atlas_batch *out);

/* --- the worker side ----------------------------------------------------------------------- */

/* Handles one command; writes a short note (cap bytes) for the reply. Its status and, on
 * failure, atlas_last_error() go back to the lead. QUIT is answered by the loop itself. */
typedef atlas_status (*atlas_rank_handler)(void *user, const atlas_rank_msg *cmd, char *note,
                                           size_t cap);

/* Serves commands from fd until QUIT (returns ATLAS_OK) or until the lead is gone
 * (ATLAS_ERR_IO). A malformed frame is ATLAS_ERR_FORMAT. */
atlas_status atlas_rank_worker_serve(int fd, atlas_rank_handler handler, void *user);

/* In a worker started by exec: the socket's fd and the rank, from $ATLAS_RANK_FD and
 * $ATLAS_RANK. ATLAS_ERR_NOT_FOUND when this process is no worker. */
atlas_status atlas_rank_worker_env(int *fd, int *rank);

/* --- the lead side ------------------------------------------------------------------------- */

typedef struct atlas_rank_group atlas_rank_group;

/* Runs in a forked worker: serve fd (typically atlas_rank_worker_serve). Its return value is
 * the child's exit status. */
typedef int (*atlas_rank_worker_fn)(int rank, int fd, void *user);

typedef struct atlas_rank_params {
    int world;                /* N, 1..ATLAS_RANK_MAX_WORLD; rank 0 is this process */
    const int *ordinals;      /* [world] GPU ordinal of each rank; NULL: rank i uses GPU i */
    /* How a worker starts, one of: */
    const char *const *argv;  /* exec argv[0] with these arguments, $ATLAS_RANK_FD and
                                 $ATLAS_RANK set (the CLI: /proc/self/exe and a hidden
                                 subcommand) */
    atlas_rank_worker_fn fn;  /* or fork and run fn(rank, fd, user): only before CUDA is
                                 initialised in this process, and in tests */
    void *user;
} atlas_rank_params;

/* Starts ranks 1..world-1. With world 1 nothing starts and every call below succeeds at once.
 * Errors: ATLAS_ERR_INVALID for bad params, ATLAS_ERR_IO when a process cannot start (those
 * already started are stopped). */
atlas_status atlas_rank_group_start(const atlas_rank_params *params, atlas_rank_group **out);

int atlas_rank_group_world(const atlas_rank_group *g);
int atlas_rank_group_ordinal(const atlas_rank_group *g, int rank);
int atlas_rank_group_pid(const atlas_rank_group *g, int rank); /* 0 for rank 0 */

/* Sends cmd with the same payload to every worker, without waiting for replies: the lead does
 * its own part (its NCCL init, its forward) and then collects. One command at a time. */
atlas_status atlas_rank_group_post(atlas_rank_group *g, atlas_rank_cmd cmd, const void *payload,
                                   size_t len, int timeout_ms);
/* Sends INIT to every worker with its rank and ordinal. */
atlas_status atlas_rank_group_post_init(atlas_rank_group *g, int timeout_ms);
/* Waits for every worker's reply to the posted command. ATLAS_OK when all succeeded;
 * otherwise the first failing status and a message naming every rank that failed and why
 * ("rank 2 (pid 123) died: killed by signal 9; rank 1: model: ..."). A worker that dies
 * ends the wait at once. */
atlas_status atlas_rank_group_collect(atlas_rank_group *g, int timeout_ms);
/* post + collect. */
atlas_status atlas_rank_group_call(atlas_rank_group *g, atlas_rank_cmd cmd, const void *payload,
                                   size_t len, int timeout_ms);

/* The note of rank's last reply ("" for rank 0 or none). Valid until the next command. */
const char *atlas_rank_group_note(const atlas_rank_group *g, int rank);

/* Sends QUIT, waits up to timeout_ms for the workers to exit, kills (SIGKILL) those still
 * running, reaps all and frees g. ATLAS_OK when every worker exited with status 0, else
 * ATLAS_ERR_IO naming the others. NULL is a no-op. */
atlas_status atlas_rank_group_close(atlas_rank_group *g, int timeout_ms);

#endif
