/* tests/test-rank.c — the tensor-parallel process protocol (parallel/rank.h) on the CPU:
 * frames over real socketpairs, the payload encodings, and groups of world size 1, 2 and 3
 * whose workers are forked (or exec'd: this program run again with --rank-worker) and
 * check every command they get: INIT's rank, ordinal and NCCL id, LOAD's directory,
 * FORWARD's batch. Workers that exit, are killed or hang are reported within the timeouts,
 * never waited on forever. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "core/error.h"
#include "parallel/rank.h"
#include "parallel/tp.h"

/* --- a test worker -------------------------------------------------------------------------- */

typedef struct misbehave {
    int rank;     /* which rank misbehaves (0: none) */
    uint32_t cmd; /* on which command */
    int how;      /* 1: exit(3), 2: SIGKILL, 3: hang */
} misbehave;

typedef struct test_worker {
    int rank, world, loaded;
    misbehave bad;
} test_worker;

static atlas_status handle(void *user, const atlas_rank_msg *m, char *note, size_t cap) {
    test_worker *w = user;
    if (w->bad.rank && w->bad.rank == w->rank && w->bad.cmd == m->type) {
        if (w->bad.how == 1) _exit(3);
        if (w->bad.how == 2) raise(SIGKILL);
        if (w->bad.how == 3) sleep(60);
    }
    switch (m->type) {
    case ATLAS_RANK_CMD_INIT: {
        atlas_rank_init in;
        ATLAS_TRY(atlas_rank_init_decode(m->payload, m->len, &in));
        if (w->rank && in.rank != w->rank)
            return atlas_fail(ATLAS_ERR_INVALID, "INIT for rank %d sent to rank %d", in.rank,
                              w->rank);
        w->rank = in.rank, w->world = in.world;
        snprintf(note, cap, "rank %d of %d on GPU %d", in.rank, in.world, in.ordinal);
        return ATLAS_OK;
    }
    case ATLAS_RANK_CMD_JOIN:
        if (!w->world) return atlas_fail(ATLAS_ERR_INVALID, "JOIN before INIT");
        if (m->len != ATLAS_NCCL_ID_BYTES)
            return atlas_fail(ATLAS_ERR_FORMAT, "JOIN: %u bytes", m->len);
        for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++)
            if (m->payload[i] != (unsigned char)(i ^ 0x5a))
                return atlas_fail(ATLAS_ERR_INVALID, "NCCL id byte %d is %d", i, m->payload[i]);
        snprintf(note, cap, "rank %d joined", w->rank);
        return ATLAS_OK;
    case ATLAS_RANK_CMD_LOAD: {
        if (!w->world) return atlas_fail(ATLAS_ERR_INVALID, "LOAD before INIT");
        struct stat st;
        const char *dir = (const char *)m->payload;
        if (strlen(dir) != m->len || stat(dir, &st) || !S_ISDIR(st.st_mode))
            return atlas_fail(ATLAS_ERR_NOT_FOUND, "model directory %s: not found", dir);
        w->loaded = 1;
        snprintf(note, cap, "rank %d loaded %s", w->rank, dir);
        return ATLAS_OK;
    }
    case ATLAS_RANK_CMD_FORWARD: {
        if (!w->loaded) return atlas_fail(ATLAS_ERR_INVALID, "FORWARD without a model");
        atlas_batch b;
        ATLAS_TRY(atlas_rank_batch_decode(m->payload, m->len, &b));
        long long sum = 0;
        for (int t = 0; t < b.n_tokens; t++) sum += b.tokens[t] * 3 + b.positions[t];
        for (int i = 0; i < b.n_seqs * b.max_blocks; i++) sum += b.block_table[i];
        snprintf(note, cap, "rank %d forward %d tokens %d seqs sum %lld", w->rank, b.n_tokens,
                 b.n_seqs, sum);
        return ATLAS_OK;
    }
    case ATLAS_RANK_CMD_RELEASE:
        w->loaded = 0;
        snprintf(note, cap, "rank %d released", w->rank);
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_INVALID, "unexpected command %u", m->type);
}

static misbehave fork_bad;

static int fork_worker(int rank, int fd, void *user) {
    test_worker w = {.rank = rank, .bad = fork_bad};
    atlas_status st = atlas_rank_worker_serve(fd, handle, &w);
    return st == ATLAS_OK ? 0 : 2;
}

/* --- helpers -------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static atlas_nccl_id test_id(void) {
    atlas_nccl_id id;
    for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++) id.bytes[i] = (unsigned char)(i ^ 0x5a);
    return id;
}

/* Two sequences: 3 prefill tokens at 0..2 and one decode token at position 17. */
static const int32_t b_tokens[] = {11, 12, 13, 500}, b_pos[] = {0, 1, 2, 17};
static const int32_t b_start[] = {0, 3, 4}, b_ctx[] = {3, 18}, b_table[] = {4, -1, 7, 9};
static const int32_t b_rows[] = {2, 3};
static const atlas_batch test_batch = {4, b_tokens, b_pos, 2, b_start, b_ctx, b_table, 2, 2, b_rows, NULL, 0};
static const long long test_sum = (11 + 12 + 13 + 500) * 3 + (0 + 1 + 2 + 17) + (4 - 1 + 7 + 9);

/* INIT, LOAD, FORWARD, RELEASE through g, checking every worker's note. */
static void drive(atlas_rank_group *g) {
    int world = atlas_rank_group_world(g);
    atlas_nccl_id id = test_id();
    CHECK_OK(atlas_rank_group_post_init(g, 1000));
    /* (the lead binds its own host here) */
    CHECK_OK(atlas_rank_group_collect(g, 5000));
    char want[256];
    for (int r = 1; r < world; r++) {
        snprintf(want, sizeof want, "rank %d of %d on GPU %d", r, world,
                 atlas_rank_group_ordinal(g, r));
        CHECK_MSG(strcmp(atlas_rank_group_note(g, r), want) == 0, "%s", atlas_rank_group_note(g, r));
    }
    CHECK_OK(atlas_rank_group_post(g, ATLAS_RANK_CMD_JOIN, id.bytes, sizeof id.bytes, 1000));
    /* (the lead's own ncclCommInitRank would run here) */
    CHECK_OK(atlas_rank_group_collect(g, 5000));
    for (int r = 1; r < world; r++) {
        snprintf(want, sizeof want, "rank %d joined", r);
        CHECK_MSG(strcmp(atlas_rank_group_note(g, r), want) == 0, "%s", atlas_rank_group_note(g, r));
    }
    const char *dir = harness_data_dir();
    CHECK_OK(atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, dir, strlen(dir), 5000));
    void *buf = NULL;
    size_t len = 0;
    CHECK_OK(atlas_rank_batch_encode(&test_batch, &buf, &len));
    for (int step = 0; step < 3; step++) {
        CHECK_OK(atlas_rank_group_post(g, ATLAS_RANK_CMD_FORWARD, buf, len, 1000));
        CHECK_OK(atlas_rank_group_collect(g, 5000));
        for (int r = 1; r < world; r++) {
            snprintf(want, sizeof want, "rank %d forward 4 tokens 2 seqs sum %lld", r, test_sum);
            CHECK_MSG(strcmp(atlas_rank_group_note(g, r), want) == 0, "%s",
                      atlas_rank_group_note(g, r));
        }
    }
    free(buf);
    CHECK_OK(atlas_rank_group_call(g, ATLAS_RANK_CMD_RELEASE, NULL, 0, 5000));
    CHECK(strcmp(atlas_rank_group_note(g, 0), "") == 0);
}

/* --- tests ---------------------------------------------------------------------------------- */

static void test_frames(void) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK_OK(atlas_rank_send(sv[0], ATLAS_RANK_CMD_LOAD, 7, "/models/x", 9, 1000));
    atlas_rank_msg m;
    CHECK_OK(atlas_rank_recv(sv[1], 1000, &m));
    CHECK(m.type == ATLAS_RANK_CMD_LOAD && m.seq == 7 && m.len == 9);
    CHECK(strcmp((const char *)m.payload, "/models/x") == 0);
    atlas_rank_msg_free(&m);
    atlas_rank_msg_free(&m);
    /* nothing sent: the deadline */
    double t0 = now_s();
    CHECK(atlas_rank_recv(sv[1], 50, &m) == ATLAS_ERR_IO && strstr(atlas_last_error(), "timed out"));
    CHECK(now_s() - t0 < 1.0);
    /* a bad magic, a length over the limit */
    uint32_t bad[4] = {0xdeadbeef, 1, 1, 0};
    CHECK(write(sv[0], bad, sizeof bad) == sizeof bad);
    CHECK(atlas_rank_recv(sv[1], 1000, &m) == ATLAS_ERR_FORMAT);
    CHECK_MSG(strstr(atlas_last_error(), "magic 0xdeadbeef at byte 0"), "%s", atlas_last_error());
    uint32_t big[4] = {ATLAS_RANK_MAGIC, 3, 1, ATLAS_RANK_MAX_PAYLOAD + 1};
    CHECK(write(sv[0], big, sizeof big) == sizeof big);
    CHECK(atlas_rank_recv(sv[1], 1000, &m) == ATLAS_ERR_FORMAT &&
          strstr(atlas_last_error(), "at byte 12"));
    CHECK(atlas_rank_send(sv[0], 3, 1, "", ATLAS_RANK_MAX_PAYLOAD + 1, 10) == ATLAS_ERR_RANGE);
    /* the peer closes in the middle of a frame, then for good */
    uint32_t half[4] = {ATLAS_RANK_MAGIC, 3, 1, 100};
    CHECK(write(sv[0], half, sizeof half) == sizeof half);
    close(sv[0]);
    CHECK(atlas_rank_recv(sv[1], 1000, &m) == ATLAS_ERR_IO &&
          strstr(atlas_last_error(), "middle of a frame"));
    CHECK(atlas_rank_recv(sv[1], 1000, &m) == ATLAS_ERR_IO &&
          strstr(atlas_last_error(), "peer closed the socket") &&
          !strstr(atlas_last_error(), "middle"));
    /* writing to a closed peer is an error, not a SIGPIPE */
    CHECK(atlas_rank_send(sv[1], ATLAS_RANK_REPLY, 1, "x", 1, 100) == ATLAS_ERR_IO);
    close(sv[1]);
}

static void test_payloads(void) {
    void *buf = NULL;
    size_t len = 0;
    CHECK_OK(atlas_rank_batch_encode(&test_batch, &buf, &len));
    CHECK(len == 4 * (4 + 4 + 4 + 3 + 2 + 4 + 2));
    atlas_batch b;
    CHECK_OK(atlas_rank_batch_decode(buf, len, &b));
    CHECK(b.n_tokens == 4 && b.n_seqs == 2 && b.max_blocks == 2 && b.n_logits == 2);
    CHECK(memcmp(b.tokens, b_tokens, sizeof b_tokens) == 0);
    CHECK(memcmp(b.positions, b_pos, sizeof b_pos) == 0);
    CHECK(memcmp(b.seq_start, b_start, sizeof b_start) == 0);
    CHECK(memcmp(b.seq_ctx, b_ctx, sizeof b_ctx) == 0);
    CHECK(memcmp(b.block_table, b_table, sizeof b_table) == 0);
    CHECK(memcmp(b.logit_rows, b_rows, sizeof b_rows) == 0);
    CHECK(atlas_rank_batch_decode(buf, len - 4, &b) == ATLAS_ERR_FORMAT);
    CHECK_MSG(strstr(atlas_last_error(), "payload of 88 bytes") &&
                  strstr(atlas_last_error(), "need 92"), "%s", atlas_last_error());
    CHECK(atlas_rank_batch_decode(buf, 8, &b) == ATLAS_ERR_FORMAT);
    ((int32_t *)buf)[1] = -2; /* n_seqs */
    CHECK(atlas_rank_batch_decode(buf, len, &b) == ATLAS_ERR_FORMAT &&
          strstr(atlas_last_error(), "n_seqs -2"));
    free(buf);
    atlas_batch huge = test_batch;
    huge.n_logits = 5; /* more logits than tokens */
    CHECK(atlas_rank_batch_encode(&huge, &buf, &len) == ATLAS_ERR_RANGE && buf == NULL);

    atlas_rank_init in = {4, 3, 7}, out;
    unsigned char ib[ATLAS_RANK_INIT_BYTES];
    atlas_rank_init_encode(&in, ib);
    CHECK_OK(atlas_rank_init_decode(ib, sizeof ib, &out));
    CHECK(out.world == 4 && out.rank == 3 && out.ordinal == 7);
    CHECK(atlas_rank_init_decode(ib, sizeof ib - 1, &out) == ATLAS_ERR_FORMAT);
    in.rank = 4;
    atlas_rank_init_encode(&in, ib);
    CHECK(atlas_rank_init_decode(ib, sizeof ib, &out) == ATLAS_ERR_FORMAT &&
          strstr(atlas_last_error(), "rank 4 of 4"));
}

static void test_world1(void) {
    atlas_rank_params p = {.world = 1};
    atlas_rank_group *g = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    CHECK(atlas_rank_group_world(g) == 1 && atlas_rank_group_pid(g, 0) == 0);
    drive(g);
    CHECK_OK(atlas_rank_group_close(g, 1000));
    CHECK_OK(atlas_rank_group_close(NULL, 0));
}

static void test_world2_fork(void) {
    fork_bad = (misbehave){0};
    atlas_rank_params p = {.world = 2, .fn = fork_worker};
    atlas_rank_group *g = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    CHECK(atlas_rank_group_pid(g, 1) > 0 && atlas_rank_group_ordinal(g, 1) == 1);
    drive(g);
    /* a worker's own error comes back with its status and message; the group goes on */
    const char *missing = "/nonexistent/atlas-model";
    atlas_status st = atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, missing, strlen(missing), 5000);
    CHECK_MSG(st == ATLAS_ERR_NOT_FOUND &&
                  strstr(atlas_last_error(), "rank 1: model directory /nonexistent/atlas-model"),
              "%s: %s", atlas_status_str(st), atlas_last_error());
    CHECK(atlas_rank_group_post(g, ATLAS_RANK_CMD_RELEASE, NULL, 0, 1000) == ATLAS_OK);
    CHECK(atlas_rank_group_post(g, ATLAS_RANK_CMD_RELEASE, NULL, 0, 1000) == ATLAS_ERR_INVALID);
    CHECK_OK(atlas_rank_group_collect(g, 5000));
    /* the protocol's cost per decode step: one FORWARD round trip to a worker */
    void *buf = NULL;
    size_t len = 0;
    CHECK_OK(atlas_rank_batch_encode(&test_batch, &buf, &len));
    CHECK_OK(atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, "/", 1, 5000));
    int steps = 2000, fails = 0;
    double t0 = now_s();
    for (int i = 0; i < steps; i++)
        fails += atlas_rank_group_call(g, ATLAS_RANK_CMD_FORWARD, buf, len, 5000) != ATLAS_OK;
    double us = (now_s() - t0) / steps * 1e6;
    CHECK(fails == 0);
    printf("FORWARD round trip to 1 worker: %.1f us (%d calls, %zu-byte batch)\n", us, steps, len);
    free(buf);
    CHECK_OK(atlas_rank_group_close(g, 5000));
}

/* A worker that misbehaves on cmd; checks the error, that the group is broken after it, and
 * that closing reports it; all within a few seconds. */
static void test_failure(int world, misbehave bad, int timeout_ms, const char *want) {
    fork_bad = bad;
    atlas_rank_params p = {.world = world, .fn = fork_worker};
    atlas_rank_group *g = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    double t0 = now_s();
    atlas_nccl_id id = test_id();
    const char *dir = harness_data_dir();
    /* the steps before the misbehaving one get a generous deadline: CI machines are slow */
    int before = bad.how == 3 ? 10000 : timeout_ms;
    atlas_status st = atlas_rank_group_post_init(g, before);
    if (st == ATLAS_OK) st = atlas_rank_group_collect(g, before);
    if (st == ATLAS_OK)
        st = atlas_rank_group_call(g, ATLAS_RANK_CMD_JOIN, id.bytes, sizeof id.bytes, before);
    if (st == ATLAS_OK)
        st = atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, dir, strlen(dir), before);
    void *buf = NULL;
    size_t len = 0;
    CHECK_OK(atlas_rank_batch_encode(&test_batch, &buf, &len));
    if (st == ATLAS_OK)
        st = atlas_rank_group_call(g, ATLAS_RANK_CMD_FORWARD, buf, len, timeout_ms);
    free(buf);
    char who[64];
    snprintf(who, sizeof who, "rank %d (pid %d)", bad.rank, atlas_rank_group_pid(g, bad.rank));
    CHECK_MSG(st == ATLAS_ERR_IO && strstr(atlas_last_error(), who) &&
                  strstr(atlas_last_error(), want),
              "%s: %s (want \"%s\", \"%s\")", atlas_status_str(st), atlas_last_error(), who, want);
    printf("reported: %s\n", atlas_last_error());
    st = atlas_rank_group_call(g, ATLAS_RANK_CMD_RELEASE, NULL, 0, timeout_ms);
    CHECK_MSG(st == ATLAS_ERR_IO && strstr(atlas_last_error(), "rank group broken") &&
                  strstr(atlas_last_error(), who), "%s", atlas_last_error());
    st = atlas_rank_group_close(g, 300);
    CHECK_MSG(st == ATLAS_ERR_IO && strstr(atlas_last_error(), who), "%s", atlas_last_error());
    double took = now_s() - t0;
    CHECK_MSG(took < 15.0, "took %.1f s", took); /* not the 60 s the hung worker sleeps */
}

/* The exec path: this program again, with --rank-worker; ordinals from the params. */
static void test_world3_exec(void) {
    const char *argv[] = {"/proc/self/exe", "--rank-worker", NULL};
    int ordinals[] = {2, 5, 7};
    atlas_rank_params p = {.world = 3, .ordinals = ordinals, .argv = argv};
    atlas_rank_group *g = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    CHECK(atlas_rank_group_ordinal(g, 0) == 2 && atlas_rank_group_ordinal(g, 2) == 7);
    drive(g);
    CHECK_OK(atlas_rank_group_close(g, 5000));

    const char *nowhere[] = {"/nonexistent/atlas", "--rank-worker", NULL};
    p.argv = nowhere;
    atlas_status st = atlas_rank_group_start(&p, &g);
    CHECK_MSG(st == ATLAS_ERR_IO && g == NULL &&
                  strstr(atlas_last_error(), "rank 1: exec /nonexistent/atlas: No such file"),
              "%s", atlas_last_error());
}

static void test_bad_params(void) {
    atlas_rank_group *g = NULL;
    atlas_rank_params p = {.world = 0};
    CHECK(atlas_rank_group_start(&p, &g) == ATLAS_ERR_INVALID);
    p.world = 2; /* neither fn nor argv */
    CHECK(atlas_rank_group_start(&p, &g) == ATLAS_ERR_INVALID && g == NULL);
    int ordinals[] = {0, -1};
    p.fn = fork_worker, p.ordinals = ordinals;
    CHECK(atlas_rank_group_start(&p, &g) == ATLAS_ERR_INVALID &&
          strstr(atlas_last_error(), "rank 1 is -1"));
}

/* A worker whose lead goes away leaves its loop with ATLAS_ERR_IO; one sent garbage, with
 * ATLAS_ERR_FORMAT. */
static void test_worker_side(void) {
    for (int garbage = 0; garbage <= 1; garbage++) {
        int sv[2];
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            close(sv[0]);
            test_worker w = {.rank = 1};
            atlas_status st = atlas_rank_worker_serve(sv[1], handle, &w);
            _exit(st == ATLAS_ERR_IO ? 10 : st == ATLAS_ERR_FORMAT ? 11 : 12);
        }
        close(sv[1]);
        if (garbage) CHECK(write(sv[0], "GET / HTTP/1.1\r\n\r\n", 18) == 18);
        close(sv[0]);
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == (garbage ? 11 : 10), "status %d",
                  status);
    }
    int fd = 0, rank = 0;
    unsetenv("ATLAS_RANK_FD");
    CHECK(atlas_rank_worker_env(&fd, &rank) == ATLAS_ERR_NOT_FOUND);
}

/* --- start-up (parallel/tp.h): bind, load NCCL, join --------------------------------------- */

/* A stand-in NCCL per process (each rank has its own), and a stand-in for the GPU binding. */
static struct { int world, rank; } tp_fake_comm;
static int tp_fake_reduces;
static ncclResult_t tpf_version(int *v) { *v = 22809; return 0; }
static ncclResult_t tpf_id(ncclUniqueId *id) {
    for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++) id->internal[i] = (char)(i * 3);
    return 0;
}
static ncclResult_t tpf_init(ncclComm_t *c, int n, ncclUniqueId id, int rank) {
    for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++)
        if (id.internal[i] != (char)(i * 3)) return 4; /* the id must arrive intact */
    tp_fake_comm.world = n, tp_fake_comm.rank = rank;
    *c = (ncclComm_t)&tp_fake_comm;
    return 0;
}
static ncclResult_t tpf_destroy(ncclComm_t c) { return 0; }
static ncclResult_t tpf_count(const ncclComm_t c, int *n) { *n = tp_fake_comm.world; return 0; }
static ncclResult_t tpf_rank(const ncclComm_t c, int *r) { *r = tp_fake_comm.rank; return 0; }
static ncclResult_t tpf_reduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, atlas_nccl_stream st) {
    tp_fake_reduces++;
    return 0;
}
static ncclResult_t tpf_group(void) { return 0; }
static const char *tpf_str(ncclResult_t r) { return r == 4 ? "invalid argument" : "?"; }
static const atlas_nccl_fns tp_fake_nccl = {tpf_version, tpf_id, tpf_init, tpf_destroy,
                                            tpf_count, tpf_rank, tpf_reduce, tpf_group,
                                            tpf_group, tpf_str, NULL};
static int tp_fake_host;
static atlas_status tpf_bind(int ordinal, atlas_host **out) {
    if (ordinal == 13) return atlas_fail(ATLAS_ERR_NO_DEVICE, "stand-in: no GPU %d", ordinal);
    *out = (atlas_host *)&tp_fake_host;
    return ATLAS_OK;
}
static const atlas_tp_options tp_fake = {.nccl_table = &tp_fake_nccl, .bind = tpf_bind};

static atlas_status tp_next(void *user, atlas_tp_rank *tp, const atlas_rank_msg *m, char *note,
                            size_t cap) {
    snprintf(note, cap, "rank %d of %d on GPU %d: %s %s", tp->rank, tp->world, tp->ordinal,
             atlas_rank_cmd_name(m->type), m->len ? (const char *)m->payload : "");
    return ATLAS_OK;
}

static int tp_worker(int rank, int fd, void *user) {
    return atlas_tp_worker_serve(fd, &tp_fake, user ? tp_next : NULL, NULL) == ATLAS_OK ? 0 : 2;
}

/* Three processes start up through the stand-ins: every rank bound, joined, then driven. */
static void test_tp_startup(void) {
    int ordinals[] = {4, 5, 6};
    atlas_rank_params p = {.world = 3, .ordinals = ordinals, .fn = tp_worker, .user = &p};
    atlas_rank_group *g = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    /* a command before INIT and JOIN is refused by name */
    atlas_status st = atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, "/m", 2, 5000);
    CHECK_MSG(st == ATLAS_ERR_INVALID && strstr(atlas_last_error(), "rank 1: rank worker: LOAD "
                                                                    "before INIT and JOIN"),
              "%s", atlas_last_error());
    atlas_tp_rank tp;
    CHECK_OK(atlas_tp_lead_start(g, &tp_fake, 5000, &tp));
    CHECK(tp.world == 3 && tp.rank == 0 && tp.ordinal == 4 && tp.comm && tp.nccl);
    CHECK(atlas_nccl_comm_world(tp.comm) == 3 && atlas_nccl_comm_rank(tp.comm) == 0);
    CHECK_MSG(strcmp(atlas_rank_group_note(g, 2), "rank 2 joined") == 0, "%s",
              atlas_rank_group_note(g, 2));
    CHECK_OK(atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, "/m", 2, 5000));
    CHECK_MSG(strcmp(atlas_rank_group_note(g, 1), "rank 1 of 3 on GPU 5: LOAD /m") == 0, "%s",
              atlas_rank_group_note(g, 1));
    float x[4] = {0};
    CHECK_OK(atlas_nccl_all_reduce_sum(tp.comm, x, x, 4, ATLAS_DTYPE_F32, NULL));
    CHECK(tp_fake_reduces == 1);
    CHECK_OK(atlas_tp_rank_close(&tp));
    CHECK(tp.comm == NULL && tp.nccl == NULL);
    CHECK_OK(atlas_rank_group_close(g, 5000));

    /* a worker without a handler for LOAD says so */
    p.world = 2, p.user = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    CHECK_OK(atlas_tp_lead_start(g, &tp_fake, 5000, &tp));
    st = atlas_rank_group_call(g, ATLAS_RANK_CMD_LOAD, "/m", 2, 5000);
    CHECK_MSG(st == ATLAS_ERR_UNSUPPORTED && strstr(atlas_last_error(), "LOAD is not wired"),
              "%s", atlas_last_error());
    CHECK_OK(atlas_tp_rank_close(&tp));
    CHECK_OK(atlas_rank_group_close(g, 5000));

    /* a worker whose GPU is missing is named, before anyone joins */
    int bad[] = {4, 5, 13};
    p.world = 3, p.ordinals = bad;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    st = atlas_tp_lead_start(g, &tp_fake, 5000, &tp);
    CHECK_MSG(st == ATLAS_ERR_NO_DEVICE &&
                  strstr(atlas_last_error(), "rank 2: GPU 13: stand-in: no GPU 13") &&
                  !strstr(atlas_last_error(), "rank 1"),
              "%s: %s", atlas_status_str(st), atlas_last_error());
    CHECK(tp.comm == NULL && tp.nccl == NULL);
    CHECK_OK(atlas_rank_group_close(g, 5000));
}

/* The real thing on this machine: this program exec'd as workers on GPUs that no machine has
 * (ordinals 61..63), with the real atlas_host_get and libnccl.so.2: every rank's error, by
 * rank, within the deadline. */
static void test_tp_real(void) {
    const char *argv[] = {"/proc/self/exe", "--tp-worker", NULL};
    int ordinals[] = {63, 62, 61};
    atlas_rank_params p = {.world = 3, .ordinals = ordinals, .argv = argv};
    atlas_rank_group *g = NULL;
    CHECK_OK(atlas_rank_group_start(&p, &g));
    if (!g) return; /* the failure is counted; nothing below can run without the group */
    atlas_tp_rank tp;
    double t0 = now_s();
    atlas_status st = atlas_tp_lead_start(g, NULL, 20000, &tp);
    printf("tensor parallel start-up here: %s\n", atlas_last_error());
    CHECK_MSG(st == ATLAS_ERR_NO_DEVICE && strstr(atlas_last_error(), "rank 0: GPU 63") &&
                  strstr(atlas_last_error(), "rank 1: GPU 62") &&
                  strstr(atlas_last_error(), "rank 2: GPU 61"),
              "%s: %s", atlas_status_str(st), atlas_last_error());
    CHECK(now_s() - t0 < 20);
    CHECK_OK(atlas_rank_group_close(g, 5000));
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--rank-worker") == 0) {
        int fd, rank;
        if (atlas_rank_worker_env(&fd, &rank) != ATLAS_OK) return 3;
        test_worker w = {.rank = rank};
        return atlas_rank_worker_serve(fd, handle, &w) == ATLAS_OK ? 0 : 2;
    }
    if (argc > 1 && strcmp(argv[1], "--tp-worker") == 0) {
        int fd, rank;
        if (atlas_rank_worker_env(&fd, &rank) != ATLAS_OK) return 3;
        return atlas_tp_worker_serve(fd, NULL, NULL, NULL) == ATLAS_OK ? 0 : 2;
    }
    test_frames();
    test_payloads();
    test_world1();
    test_world2_fork();
    test_failure(3, (misbehave){2, ATLAS_RANK_CMD_FORWARD, 1}, 5000, "died: exited with status 3");
    test_failure(2, (misbehave){1, ATLAS_RANK_CMD_LOAD, 2}, 5000, "died: killed by signal 9");
    test_failure(3, (misbehave){1, ATLAS_RANK_CMD_FORWARD, 3}, 300, "no reply to FORWARD within 300 ms");
    test_failure(2, (misbehave){1, ATLAS_RANK_CMD_INIT, 1}, 5000, "exited with status 3");
    test_failure(3, (misbehave){2, ATLAS_RANK_CMD_JOIN, 2}, 5000, "killed by signal 9");
    test_world3_exec();
    test_bad_params();
    test_worker_side();
    test_tp_startup();
    test_tp_real();
    return harness_finish();
}
