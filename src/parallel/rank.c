/* parallel/rank.c — worker processes and the command protocol; see rank.h. */
#include "parallel/rank.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

const char *atlas_rank_cmd_name(uint32_t type) {
    switch (type) {
    case ATLAS_RANK_CMD_INIT: return "INIT";
    case ATLAS_RANK_CMD_LOAD: return "LOAD";
    case ATLAS_RANK_CMD_FORWARD: return "FORWARD";
    case ATLAS_RANK_CMD_RELEASE: return "RELEASE";
    case ATLAS_RANK_CMD_QUIT: return "QUIT";
    case ATLAS_RANK_CMD_JOIN: return "JOIN";
    case ATLAS_RANK_REPLY: return "REPLY";
    default: return "?";
    }
}

void atlas_rank_msg_free(atlas_rank_msg *msg) {
    if (!msg) return;
    free(msg->payload);
    msg->payload = NULL;
}

/* --- deadlines and raw I/O ------------------------------------------------------------------ */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t deadline_of(int timeout_ms) { return timeout_ms < 0 ? -1 : now_ms() + timeout_ms; }

/* Milliseconds left for poll: -1 (forever) or >= 0. */
static int left_ms(int64_t deadline) {
    if (deadline < 0) return -1;
    int64_t left = deadline - now_ms();
    return left < 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

/* Waits until fd is ready for `events`; 0 when ready, else an error. */
static atlas_status wait_fd(int fd, short events, int64_t deadline, const char *what) {
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, left_ms(deadline));
        if (r > 0) return ATLAS_OK; /* ready, or hung up: the read/write says which */
        if (r == 0) return atlas_fail(ATLAS_ERR_IO, "%s: timed out", what);
        if (errno != EINTR) return atlas_fail(ATLAS_ERR_IO, "%s: poll: %s", what, strerror(errno));
    }
}

static atlas_status write_all(int fd, const void *buf, size_t len, int64_t deadline) {
    const char *p = buf;
    while (len) {
        ATLAS_TRY(wait_fd(fd, POLLOUT, deadline, "send"));
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return atlas_fail(ATLAS_ERR_IO, "send: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return ATLAS_OK;
}

/* Reads len bytes; `at` is the frame offset of buf, for messages. */
static atlas_status read_all(int fd, void *buf, size_t len, int64_t deadline, size_t at) {
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        ATLAS_TRY(wait_fd(fd, POLLIN, deadline, "recv"));
        ssize_t n = recv(fd, p + got, len - got, MSG_DONTWAIT);
        if (n == 0)
            return atlas_fail(ATLAS_ERR_IO, "recv: peer closed the socket%s",
                              at + got ? " in the middle of a frame" : "");
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return atlas_fail(ATLAS_ERR_IO, "recv: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    return ATLAS_OK;
}

/* --- frames ----------------------------------------------------------------------------------- */

atlas_status atlas_rank_send(int fd, uint32_t type, uint32_t seq, const void *payload,
                             size_t len, int timeout_ms) {
    if (len > ATLAS_RANK_MAX_PAYLOAD)
        return atlas_fail(ATLAS_ERR_RANGE, "rank frame %s: payload of %zu bytes over %u",
                          atlas_rank_cmd_name(type), len, ATLAS_RANK_MAX_PAYLOAD);
    uint32_t head[4] = {ATLAS_RANK_MAGIC, type, seq, (uint32_t)len};
    int64_t deadline = deadline_of(timeout_ms);
    ATLAS_TRY(write_all(fd, head, sizeof head, deadline));
    if (len) ATLAS_TRY(write_all(fd, payload, len, deadline));
    return ATLAS_OK;
}

atlas_status atlas_rank_recv(int fd, int timeout_ms, atlas_rank_msg *out) {
    memset(out, 0, sizeof *out);
    int64_t deadline = deadline_of(timeout_ms);
    uint32_t head[4];
    ATLAS_TRY(read_all(fd, head, sizeof head, deadline, 0));
    if (head[0] != ATLAS_RANK_MAGIC)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank frame: magic 0x%08x at byte 0, want 0x%08x",
                          head[0], ATLAS_RANK_MAGIC);
    if (head[3] > ATLAS_RANK_MAX_PAYLOAD)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank frame %s: payload length %u at byte 12 over "
                          "%u", atlas_rank_cmd_name(head[1]), head[3], ATLAS_RANK_MAX_PAYLOAD);
    unsigned char *payload = malloc((size_t)head[3] + 1);
    if (!payload) return atlas_fail(ATLAS_ERR_NOMEM, "rank frame: %u bytes", head[3]);
    atlas_status st = read_all(fd, payload, head[3], deadline, sizeof head);
    if (st != ATLAS_OK) {
        free(payload);
        return st;
    }
    payload[head[3]] = '\0';
    *out = (atlas_rank_msg){head[1], head[2], head[3], payload};
    return ATLAS_OK;
}

/* --- payloads --------------------------------------------------------------------------------- */

void atlas_rank_init_encode(const atlas_rank_init *in, unsigned char out[ATLAS_RANK_INIT_BYTES]) {
    int32_t v[3] = {in->world, in->rank, in->ordinal};
    memcpy(out, v, sizeof v);
}

atlas_status atlas_rank_init_decode(const void *buf, size_t len, atlas_rank_init *out) {
    if (len != ATLAS_RANK_INIT_BYTES)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank INIT: payload of %zu bytes, want %d", len,
                          (int)ATLAS_RANK_INIT_BYTES);
    int32_t v[3];
    memcpy(v, buf, sizeof v);
    out->world = v[0], out->rank = v[1], out->ordinal = v[2];
    if (out->world < 1 || out->world > ATLAS_RANK_MAX_WORLD || out->rank < 0 ||
        out->rank >= out->world || out->ordinal < 0)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank INIT: rank %d of %d on GPU %d", out->rank,
                          out->world, out->ordinal);
    return ATLAS_OK;
}

/* Element counts of the batch's arrays, in payload order; -1 when a count is out of range. */
static int64_t batch_counts(const int32_t c[4], int64_t n[6]) {
    int64_t tokens = c[0], seqs = c[1], blocks = c[2], logits = c[3];
    if (tokens < 1 || seqs < 1 || blocks < 1 || logits < 0 || tokens > (1 << 24) ||
        seqs > (1 << 24) || blocks > (1 << 24) || logits > tokens)
        return -1;
    n[0] = tokens, n[1] = tokens, n[2] = seqs + 1, n[3] = seqs, n[4] = seqs * blocks;
    n[5] = logits;
    int64_t total = 4;
    for (int i = 0; i < 6; i++) total += n[i];
    return total;
}

atlas_status atlas_rank_batch_encode(const atlas_batch *b, void **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int32_t c[4] = {b->n_tokens, b->n_seqs, b->max_blocks, b->n_logits};
    int64_t n[6];
    int64_t total = batch_counts(c, n);
    if (total < 0 || (uint64_t)total * 4 > ATLAS_RANK_MAX_PAYLOAD)
        return atlas_fail(ATLAS_ERR_RANGE, "rank FORWARD: batch of %d tokens, %d sequences, %d "
                          "blocks, %d logits cannot be sent", c[0], c[1], c[2], c[3]);
    int32_t *buf = malloc((size_t)total * 4);
    if (!buf) return atlas_fail(ATLAS_ERR_NOMEM, "rank FORWARD: %lld bytes", (long long)total * 4);
    const int32_t *arrays[6] = {b->tokens, b->positions, b->seq_start, b->seq_ctx,
                                b->block_table, b->logit_rows};
    memcpy(buf, c, sizeof c);
    int32_t *p = buf + 4;
    for (int i = 0; i < 6; i++) {
        if (n[i]) memcpy(p, arrays[i], (size_t)n[i] * 4);
        p += n[i];
    }
    *out = buf;
    *len = (size_t)total * 4;
    return ATLAS_OK;
}

atlas_status atlas_rank_batch_decode(const void *buf, size_t len, atlas_batch *out) {
    memset(out, 0, sizeof *out);
    int32_t c[4];
    if (len < sizeof c)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank FORWARD: payload of %zu bytes, shorter than "
                          "its 16-byte header", len);
    memcpy(c, buf, sizeof c);
    int64_t n[6];
    int64_t total = batch_counts(c, n);
    if (total < 0)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank FORWARD: counts at byte 0 out of range: "
                          "n_tokens %d, n_seqs %d, max_blocks %d, n_logits %d", c[0], c[1],
                          c[2], c[3]);
    if ((uint64_t)total * 4 != len)
        return atlas_fail(ATLAS_ERR_FORMAT, "rank FORWARD: payload of %zu bytes, its counts "
                          "(n_tokens %d, n_seqs %d, max_blocks %d, n_logits %d) need %lld", len,
                          c[0], c[1], c[2], c[3], (long long)total * 4);
    const int32_t *p = (const int32_t *)buf + 4;
    const int32_t **arrays[6] = {&out->tokens, &out->positions, &out->seq_start, &out->seq_ctx,
                                 &out->block_table, &out->logit_rows};
    for (int i = 0; i < 6; i++) {
        *arrays[i] = p;
        p += n[i];
    }
    out->n_tokens = c[0], out->n_seqs = c[1], out->max_blocks = c[2], out->n_logits = c[3];
    return ATLAS_OK;
}

/* --- the worker side -------------------------------------------------------------------------- */

static atlas_status send_reply(int fd, uint32_t seq, atlas_status st, const char *note) {
    size_t n = strlen(note);
    if (n > 4000) n = 4000;
    unsigned char buf[4 + 4000];
    int32_t s = st;
    memcpy(buf, &s, 4);
    memcpy(buf + 4, note, n);
    return atlas_rank_send(fd, ATLAS_RANK_REPLY, seq, buf, 4 + n, 10000);
}

atlas_status atlas_rank_worker_serve(int fd, atlas_rank_handler handler, void *user) {
    for (;;) {
        atlas_rank_msg m;
        atlas_status st = atlas_rank_recv(fd, -1, &m);
        if (st != ATLAS_OK) return atlas_fail_wrap(st, "rank worker: waiting for the lead");
        if (m.type == ATLAS_RANK_CMD_QUIT) {
            atlas_rank_msg_free(&m);
            send_reply(fd, m.seq, ATLAS_OK, "bye"); /* the lead may be gone already */
            return ATLAS_OK;
        }
        char note[1024] = "";
        atlas_error_clear();
        if (m.type < ATLAS_RANK_CMD_INIT || m.type > ATLAS_RANK_CMD_JOIN)
            st = atlas_fail(ATLAS_ERR_INVALID, "rank worker: unknown command %u", m.type);
        else
            st = handler(user, &m, note, sizeof note);
        atlas_rank_msg_free(&m);
        st = send_reply(fd, m.seq, st, st == ATLAS_OK ? note : atlas_last_error());
        if (st != ATLAS_OK) return atlas_fail_wrap(st, "rank worker: replying to the lead");
    }
}

atlas_status atlas_rank_worker_env(int *fd, int *rank) {
    const char *f = getenv("ATLAS_RANK_FD"), *r = getenv("ATLAS_RANK");
    if (!f || !r) return atlas_fail(ATLAS_ERR_NOT_FOUND, "not a rank worker: no $ATLAS_RANK_FD");
    char *end1, *end2;
    long fv = strtol(f, &end1, 10), rv = strtol(r, &end2, 10);
    if (*end1 || *end2 || fv < 0 || fv > INT_MAX || rv < 1 || rv >= ATLAS_RANK_MAX_WORLD)
        return atlas_fail(ATLAS_ERR_INVALID, "rank worker: $ATLAS_RANK_FD \"%s\", $ATLAS_RANK "
                          "\"%s\"", f, r);
    *fd = (int)fv;
    *rank = (int)rv;
    return ATLAS_OK;
}

/* --- the lead side ---------------------------------------------------------------------------- */

extern char **environ;

typedef struct worker {
    int ordinal;
    pid_t pid;       /* 0 for rank 0 */
    int fd;          /* the lead's end; -1 once closed */
    int pending;     /* a posted command awaits its reply */
    int reaped;      /* waitpid returned; status holds why it ended */
    int status;
    char note[1024]; /* of the last reply */
} worker;

struct atlas_rank_group {
    int world;
    uint32_t seq, cmd;
    char broken[1024]; /* why the group cannot go on; "" while it can */
    worker w[];        /* [world] */
};

int atlas_rank_group_world(const atlas_rank_group *g) { return g->world; }
int atlas_rank_group_ordinal(const atlas_rank_group *g, int rank) { return g->w[rank].ordinal; }
int atlas_rank_group_pid(const atlas_rank_group *g, int rank) { return (int)g->w[rank].pid; }
const char *atlas_rank_group_note(const atlas_rank_group *g, int rank) { return g->w[rank].note; }

/* How a worker ended, or that it only closed its socket (waits up to 2 s for the exit). */
static void describe_end(worker *w, int rank, char *out, size_t cap) {
    for (int i = 0; i < 200 && !w->reaped; i++) {
        if (waitpid(w->pid, &w->status, WNOHANG) == w->pid) w->reaped = 1;
        else usleep(10000);
    }
    if (!w->reaped)
        snprintf(out, cap, "rank %d (pid %d) closed its socket", rank, (int)w->pid);
    else if (WIFEXITED(w->status))
        snprintf(out, cap, "rank %d (pid %d) died: exited with status %d", rank, (int)w->pid,
                 WEXITSTATUS(w->status));
    else if (WIFSIGNALED(w->status))
        snprintf(out, cap, "rank %d (pid %d) died: killed by signal %d (%s)", rank, (int)w->pid,
                 WTERMSIG(w->status), strsignal(WTERMSIG(w->status)));
    else snprintf(out, cap, "rank %d (pid %d) died (status 0x%x)", rank, (int)w->pid, w->status);
}

/* The group cannot go on: remember why (the first reason) and return it. */
static atlas_status break_group(atlas_rank_group *g, const char *why) {
    char copy[1024]; /* why may be atlas_last_error(), which atlas_fail overwrites */
    snprintf(copy, sizeof copy, "%s", why);
    if (!g->broken[0]) snprintf(g->broken, sizeof g->broken, "%s", copy);
    return atlas_fail(ATLAS_ERR_IO, "%s", copy);
}

static atlas_status worker_gone(atlas_rank_group *g, int rank) {
    char why[512];
    describe_end(&g->w[rank], rank, why, sizeof why);
    close(g->w[rank].fd);
    g->w[rank].fd = -1;
    g->w[rank].pending = 0;
    return break_group(g, why);
}

/* environ without ATLAS_RANK*, plus this worker's two variables: built before fork, since
 * the child of a threaded process may only call async-signal-safe functions. */
static char **worker_env(int rank, int fd, char *buf_fd, char *buf_rank) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = malloc((n + 3) * sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ATLAS_RANK_FD=", 14) && strncmp(environ[i], "ATLAS_RANK=", 11))
            env[k++] = environ[i];
    snprintf(buf_fd, 32, "ATLAS_RANK_FD=%d", fd);
    snprintf(buf_rank, 32, "ATLAS_RANK=%d", rank);
    env[k++] = buf_fd;
    env[k++] = buf_rank;
    env[k] = NULL;
    return env;
}

/* In the child: from here on only async-signal-safe calls until exec or _exit. */
static void child_main(const atlas_rank_params *p, atlas_rank_group *g, int rank, int fd,
                       pid_t lead, char **env, int err_pipe) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a worker never outlives its lead */
    if (getppid() != lead) _exit(126);
    for (int r = 1; r <= rank; r++) /* the lead's ends; EOF must mean the lead is gone */
        if (g->w[r].fd >= 0) close(g->w[r].fd);
    if (p->fn) _exit(p->fn(rank, fd, p->user) & 0xff);
    fcntl(fd, F_SETFD, 0); /* this end survives exec */
    execve(p->argv[0], (char *const *)p->argv, env);
    int e = errno;
    ssize_t ignored = write(err_pipe, &e, sizeof e);
    (void)ignored;
    _exit(127);
}

static atlas_status spawn(const atlas_rank_params *p, atlas_rank_group *g, int rank) {
    int sv[2], ep[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        return atlas_fail(ATLAS_ERR_IO, "rank %d: socketpair: %s", rank, strerror(errno));
    char buf_fd[32], buf_rank[32];
    char **env = p->fn ? NULL : worker_env(rank, sv[1], buf_fd, buf_rank);
    if (!p->fn && (!env || pipe2(ep, O_CLOEXEC))) {
        free(env);
        close(sv[0]);
        close(sv[1]);
        return atlas_fail(ATLAS_ERR_IO, "rank %d: preparing exec: %s", rank, strerror(errno));
    }
    g->w[rank].fd = sv[0]; /* so that the child closes it too */
    pid_t lead = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) child_main(p, g, rank, sv[1], lead, env, ep[1]);
    close(sv[1]);
    free(env);
    if (pid < 0) {
        close(sv[0]);
        g->w[rank].fd = -1;
        if (ep[0] >= 0) close(ep[0]), close(ep[1]);
        return atlas_fail(ATLAS_ERR_IO, "rank %d: fork: %s", rank, strerror(errno));
    }
    g->w[rank].pid = pid;
    if (ep[0] < 0) return ATLAS_OK;
    close(ep[1]);
    int e = 0; /* EOF: exec succeeded; an errno: it failed */
    ssize_t n;
    do n = read(ep[0], &e, sizeof e); while (n < 0 && errno == EINTR);
    close(ep[0]);
    if (n == (ssize_t)sizeof e)
        return atlas_fail(ATLAS_ERR_IO, "rank %d: exec %s: %s", rank, p->argv[0], strerror(e));
    return ATLAS_OK;
}

atlas_status atlas_rank_group_start(const atlas_rank_params *p, atlas_rank_group **out) {
    *out = NULL;
    if (p->world < 1 || p->world > ATLAS_RANK_MAX_WORLD)
        return atlas_fail(ATLAS_ERR_INVALID, "rank group: world size %d outside 1..%d", p->world,
                          ATLAS_RANK_MAX_WORLD);
    if (p->world > 1 && !p->fn == !(p->argv && p->argv[0]))
        return atlas_fail(ATLAS_ERR_INVALID, "rank group: give either argv or fn to start "
                          "workers");
    for (int r = 0; p->ordinals && r < p->world; r++)
        if (p->ordinals[r] < 0)
            return atlas_fail(ATLAS_ERR_INVALID, "rank group: ordinal of rank %d is %d", r,
                              p->ordinals[r]);
    atlas_rank_group *g = calloc(1, sizeof *g + (size_t)p->world * sizeof(worker));
    if (!g) return atlas_fail(ATLAS_ERR_NOMEM, "rank group of %d", p->world);
    g->world = p->world;
    for (int r = 0; r < p->world; r++) {
        g->w[r].fd = -1;
        g->w[r].ordinal = p->ordinals ? p->ordinals[r] : r;
    }
    for (int r = 1; r < p->world; r++) {
        atlas_status st = spawn(p, g, r);
        if (st != ATLAS_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", atlas_last_error());
            atlas_rank_group_close(g, 1000);
            return atlas_fail(st, "%s", why);
        }
    }
    *out = g;
    return ATLAS_OK;
}

static atlas_status post_one(atlas_rank_group *g, int rank, const void *payload, size_t len,
                             int timeout_ms) {
    atlas_status st = atlas_rank_send(g->w[rank].fd, g->cmd, g->seq, payload, len, timeout_ms);
    if (st == ATLAS_ERR_RANGE) return st;
    if (st != ATLAS_OK) {
        if (strstr(atlas_last_error(), "timed out")) {
            char why[256];
            snprintf(why, sizeof why, "rank %d (pid %d): not reading: %s timed out after %d ms",
                     rank, (int)g->w[rank].pid, atlas_rank_cmd_name(g->cmd), timeout_ms);
            return break_group(g, why);
        }
        return worker_gone(g, rank);
    }
    g->w[rank].pending = 1;
    g->w[rank].note[0] = '\0';
    return ATLAS_OK;
}

static atlas_status begin_post(atlas_rank_group *g, atlas_rank_cmd cmd) {
    if (g->broken[0]) return atlas_fail(ATLAS_ERR_IO, "rank group broken: %s", g->broken);
    for (int r = 1; r < g->world; r++)
        if (g->w[r].pending)
            return atlas_fail(ATLAS_ERR_INVALID, "rank group: %s posted before %s was "
                              "collected", atlas_rank_cmd_name(cmd), atlas_rank_cmd_name(g->cmd));
    g->cmd = cmd;
    g->seq++;
    return ATLAS_OK;
}

atlas_status atlas_rank_group_post(atlas_rank_group *g, atlas_rank_cmd cmd, const void *payload,
                                   size_t len, int timeout_ms) {
    ATLAS_TRY(begin_post(g, cmd));
    for (int r = 1; r < g->world; r++) ATLAS_TRY(post_one(g, r, payload, len, timeout_ms));
    return ATLAS_OK;
}

atlas_status atlas_rank_group_post_init(atlas_rank_group *g, int timeout_ms) {
    ATLAS_TRY(begin_post(g, ATLAS_RANK_CMD_INIT));
    for (int r = 1; r < g->world; r++) {
        atlas_rank_init in = {g->world, r, g->w[r].ordinal};
        unsigned char buf[ATLAS_RANK_INIT_BYTES];
        atlas_rank_init_encode(&in, buf);
        ATLAS_TRY(post_one(g, r, buf, sizeof buf, timeout_ms));
    }
    return ATLAS_OK;
}

/* Reads rank's reply. Its error status goes into *first and errs (the group stays usable);
 * a dead worker or a malformed reply breaks the group. */
static atlas_status read_reply(atlas_rank_group *g, int rank, int64_t deadline,
                               atlas_status *first, char *errs, size_t cap) {
    worker *w = &g->w[rank];
    atlas_rank_msg m;
    /* poll said the reply has begun: the rest follows at once, even past the deadline */
    int left = left_ms(deadline);
    atlas_status st = atlas_rank_recv(w->fd, left >= 0 && left < 1000 ? 1000 : left, &m);
    if (st == ATLAS_ERR_FORMAT) return break_group(g, atlas_last_error());
    if (st != ATLAS_OK && strstr(atlas_last_error(), "timed out")) {
        char why[256];
        snprintf(why, sizeof why, "rank %d (pid %d): reply to %s cut short", rank,
                 (int)w->pid, atlas_rank_cmd_name(g->cmd));
        return break_group(g, why);
    }
    if (st != ATLAS_OK) return worker_gone(g, rank);
    int32_t status = ATLAS_OK;
    if (m.type != ATLAS_RANK_REPLY || m.seq != g->seq || m.len < 4) {
        char why[256];
        snprintf(why, sizeof why, "rank %d: sent %s #%u of %u bytes, want the reply to %s #%u",
                 rank, atlas_rank_cmd_name(m.type), m.seq, m.len, atlas_rank_cmd_name(g->cmd),
                 g->seq);
        atlas_rank_msg_free(&m);
        return break_group(g, why);
    }
    memcpy(&status, m.payload, 4);
    snprintf(w->note, sizeof w->note, "%s", (const char *)m.payload + 4);
    atlas_rank_msg_free(&m);
    w->pending = 0;
    if (status != ATLAS_OK) {
        if (*first == ATLAS_OK) /* a code atlas does not know is a bug somewhere */
            *first = status > 0 || status < ATLAS_ERR_INTERNAL ? ATLAS_ERR_INTERNAL : status;
        size_t len = strlen(errs);
        snprintf(errs + len, cap - len, "%srank %d: %s", len ? "; " : "", rank, w->note);
    }
    return ATLAS_OK;
}

atlas_status atlas_rank_group_collect(atlas_rank_group *g, int timeout_ms) {
    int64_t deadline = deadline_of(timeout_ms);
    atlas_status first = ATLAS_OK;
    char errs[2048] = "";
    for (;;) {
        struct pollfd pfd[ATLAS_RANK_MAX_WORLD];
        int rank_of[ATLAS_RANK_MAX_WORLD], n = 0;
        for (int r = 1; r < g->world; r++)
            if (g->w[r].pending) {
                pfd[n] = (struct pollfd){g->w[r].fd, POLLIN, 0};
                rank_of[n++] = r;
            }
        if (n == 0) break;
        int k = poll(pfd, (nfds_t)n, left_ms(deadline));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return atlas_fail(ATLAS_ERR_IO, "rank group: poll: %s", strerror(errno));
        if (k == 0) {
            char why[1024] = "";
            for (int i = 0; i < n; i++) {
                size_t len = strlen(why);
                snprintf(why + len, sizeof why - len, "%srank %d (pid %d): no reply to %s "
                         "within %d ms", len ? "; " : "", rank_of[i], (int)g->w[rank_of[i]].pid,
                         atlas_rank_cmd_name(g->cmd), timeout_ms);
            }
            return break_group(g, why);
        }
        for (int i = 0; i < n; i++)
            if (pfd[i].revents) {
                atlas_status st = read_reply(g, rank_of[i], deadline, &first, errs, sizeof errs);
                if (st != ATLAS_OK) { /* a dead rank ends the wait: the others may hang on it */
                    if (!errs[0]) return st;
                    char why[1024];
                    snprintf(why, sizeof why, "%s", atlas_last_error());
                    return atlas_fail(st, "%s; %s", why, errs);
                }
            }
    }
    if (first != ATLAS_OK) return atlas_fail(first, "%s", errs);
    return ATLAS_OK;
}

atlas_status atlas_rank_group_call(atlas_rank_group *g, atlas_rank_cmd cmd, const void *payload,
                                   size_t len, int timeout_ms) {
    ATLAS_TRY(atlas_rank_group_post(g, cmd, payload, len, timeout_ms));
    return atlas_rank_group_collect(g, timeout_ms);
}

atlas_status atlas_rank_group_close(atlas_rank_group *g, int timeout_ms) {
    if (!g) return ATLAS_OK;
    int64_t deadline = deadline_of(timeout_ms);
    for (int r = 1; r < g->world; r++) {
        worker *w = &g->w[r];
        if (w->fd < 0) continue;
        /* QUIT, then close: a worker reads what was sent before the close, then EOF */
        atlas_rank_send(w->fd, ATLAS_RANK_CMD_QUIT, ++g->seq, NULL, 0, 100);
        close(w->fd);
        w->fd = -1;
    }
    char errs[2048] = "";
    for (int r = 1; r < g->world; r++) {
        worker *w = &g->w[r];
        if (!w->pid) continue;
        while (!w->reaped) {
            if (waitpid(w->pid, &w->status, WNOHANG) == w->pid) w->reaped = 1;
            else if (left_ms(deadline) == 0) break;
            else usleep(2000);
        }
        char why[512] = "";
        if (!w->reaped) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, &w->status, 0);
            snprintf(why, sizeof why, "rank %d (pid %d) did not exit within %d ms: killed", r,
                     (int)w->pid, timeout_ms);
        } else if (!WIFEXITED(w->status) || WEXITSTATUS(w->status) != 0) {
            describe_end(w, r, why, sizeof why);
        }
        if (why[0]) {
            size_t len = strlen(errs);
            snprintf(errs + len, sizeof errs - len, "%s%s", len ? "; " : "", why);
        }
    }
    free(g);
    if (errs[0]) return atlas_fail(ATLAS_ERR_IO, "rank group: %s", errs);
    return ATLAS_OK;
}
