/* tests/test-nccl.c — NCCL loaded at run time (parallel/nccl.h), without a GPU:
 *   - a path that does not exist and a real library that is not NCCL: clear errors;
 *   - this machine's libnccl.so.2 when it has one: its version, a unique id, and
 *     ncclCommInitRank's own error where there is no GPU (a communicator where there is);
 *   - NCCL_NVLS_ENABLE forced to 0 before NCCL reads it;
 *   - a fake table: the call sequence, two "ranks" in threads summing through the wrapper,
 *     and the error text of a failing call.
 * Scenarios that load a library or change the environment run in a child process. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "parallel/nccl.h"

static void scenario_missing(void) {
    const char *path = "/nonexistent/atlas-test/libnccl.so.2";
    atlas_nccl *n = (atlas_nccl *)&n;
    atlas_status st = atlas_nccl_open(path, &n);
    CHECK(st == ATLAS_ERR_NO_DEVICE && n == NULL);
    CHECK_MSG(strstr(atlas_last_error(), "NCCL not available") &&
                  strstr(atlas_last_error(), "dlopen") && strstr(atlas_last_error(), path),
              "%s", atlas_last_error());
    printf("missing: %s\n", atlas_last_error());
    /* $ATLAS_LIBNCCL is where open(NULL) looks */
    setenv("ATLAS_LIBNCCL", path, 1);
    st = atlas_nccl_open(NULL, &n);
    CHECK(st == ATLAS_ERR_NO_DEVICE && strstr(atlas_last_error(), path));
    /* NVLS is off even when NCCL never loads */
    CHECK(getenv("NCCL_NVLS_ENABLE") && strcmp(getenv("NCCL_NVLS_ENABLE"), "0") == 0);
}

static void scenario_not_nccl(void) {
    atlas_nccl *n = NULL;
    atlas_status st = atlas_nccl_open("libm.so.6", &n);
    CHECK(st == ATLAS_ERR_UNSUPPORTED && n == NULL);
    CHECK_MSG(strstr(atlas_last_error(), "libm.so.6: no symbol ncclGetVersion"), "%s",
              atlas_last_error());
}

/* This machine's NCCL: absent (the clear error), or loaded; without a GPU its communicator
 * init fails with NCCL's own words, with one it forms a communicator of one rank. */
static void scenario_default(void) {
    unsetenv("ATLAS_LIBNCCL");
    setenv("NCCL_NVLS_ENABLE", "1", 1);
    atlas_nccl *n = NULL;
    atlas_status st = atlas_nccl_open(NULL, &n);
    CHECK(strcmp(getenv("NCCL_NVLS_ENABLE"), "0") == 0);
    if (st != ATLAS_OK) {
        printf("no NCCL: %s\n", atlas_last_error());
        CHECK(st == ATLAS_ERR_NO_DEVICE && strstr(atlas_last_error(), "libnccl.so.2"));
        return;
    }
    int v = atlas_nccl_version(n);
    printf("NCCL %d.%d.%d from %s; %s\n", v / 10000, v / 100 % 100, v % 100, atlas_nccl_path(n),
           atlas_nccl_env_note(n));
    CHECK(v >= ATLAS_NCCL_MIN_VERSION);
    CHECK(strstr(atlas_nccl_env_note(n), "was \"1\""));
    atlas_nccl_id id;
    memset(&id, 0, sizeof id);
    CHECK_OK(atlas_nccl_unique_id(n, &id));
    int nonzero = 0;
    for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++) nonzero |= id.bytes[i];
    CHECK(nonzero);
    atlas_nccl_comm *c = NULL;
    st = atlas_nccl_comm_init(n, 1, 0, &id, &c);
    if (st == ATLAS_OK) {
        printf("a communicator of 1 rank\n");
        CHECK(atlas_nccl_comm_world(c) == 1 && atlas_nccl_comm_rank(c) == 0);
        CHECK(atlas_nccl_close(n) == ATLAS_ERR_BUSY);
        CHECK_OK(atlas_nccl_comm_destroy(c));
    } else {
        printf("comm init: %s\n", atlas_last_error());
        CHECK(st == ATLAS_ERR_DEVICE && c == NULL);
        CHECK_MSG(strstr(atlas_last_error(), "ncclCommInitRank failed: nccl"), "%s",
                  atlas_last_error());
    }
    CHECK_OK(atlas_nccl_close(n));
}

/* --- the fake table --------------------------------------------------------------------- */

static char fake_log[4096];
static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t fake_barrier;
static int fake_version = 22809, fake_fail_allreduce, fake_wrong_rank;

typedef struct fake_comm { int world, rank; unsigned char id0; } fake_comm;
static fake_comm fake_comms[2];
static const float *fake_send[2];

static void logf_(const char *fmt, int a, int b, int c) {
    pthread_mutex_lock(&fake_mu);
    size_t len = strlen(fake_log);
    snprintf(fake_log + len, sizeof fake_log - len, fmt, a, b, c);
    pthread_mutex_unlock(&fake_mu);
}

static ncclResult_t fake_version_fn(int *v) { *v = fake_version; return 0; }
static ncclResult_t fake_unique_id(ncclUniqueId *id) {
    for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++) id->internal[i] = (char)(i * 7 + 1);
    logf_("id;", 0, 0, 0);
    return 0;
}
static ncclResult_t fake_init(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    int intact = 1;
    for (int i = 0; i < ATLAS_NCCL_ID_BYTES; i++) intact &= id.internal[i] == (char)(i * 7 + 1);
    fake_comms[rank] = (fake_comm){nranks, rank, (unsigned char)id.internal[0]};
    *comm = (ncclComm_t)&fake_comms[rank];
    logf_("init(%d,%d);", nranks, rank, 0);
    if (!intact) logf_("BADID;", 0, 0, 0); /* the id must arrive byte for byte, by value */
    return 0;
}
static ncclResult_t fake_destroy(ncclComm_t comm) {
    logf_("destroy(%d);", ((fake_comm *)comm)->rank, 0, 0);
    return 0;
}
static ncclResult_t fake_count(const ncclComm_t comm, int *count) {
    *count = ((fake_comm *)comm)->world;
    return 0;
}
static ncclResult_t fake_user_rank(const ncclComm_t comm, int *rank) {
    *rank = ((fake_comm *)comm)->rank + fake_wrong_rank;
    return 0;
}
/* Sums the f32 buffers of both ranks, as NCCL would across processes. */
static ncclResult_t fake_all_reduce(const void *send, void *recv, size_t count,
                                    ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                    atlas_nccl_stream stream) {
    fake_comm *c = (fake_comm *)comm;
    logf_("allreduce(%d,type %d,op %d);", (int)count, type, op);
    if (fake_fail_allreduce) return 5;
    if (c->world == 1 || type != ATLAS_NCCL_FLOAT32 || stream != (atlas_nccl_stream)&fake_log)
        return 4;
    fake_send[c->rank] = send;
    pthread_barrier_wait(&fake_barrier);
    float sum[64];
    for (size_t i = 0; i < count; i++) sum[i] = fake_send[0][i] + fake_send[1][i];
    pthread_barrier_wait(&fake_barrier); /* everyone has read before anyone writes */
    memcpy(recv, sum, count * sizeof(float));
    return 0;
}
static ncclResult_t fake_group_start(void) { logf_("start;", 0, 0, 0); return 0; }
static ncclResult_t fake_group_end(void) { logf_("end;", 0, 0, 0); return 0; }
static const char *fake_error_string(ncclResult_t r) {
    return r == 5 ? "invalid usage (fake)" : r == 4 ? "invalid argument (fake)" : "?";
}
static const char *fake_last_error(ncclComm_t comm) { return "fake: peer went away"; }

static atlas_nccl_fns fake_table(void) {
    return (atlas_nccl_fns){fake_version_fn, fake_unique_id, fake_init, fake_destroy,
                            fake_count, fake_user_rank, fake_all_reduce, fake_group_start,
                            fake_group_end, fake_error_string, fake_last_error};
}

typedef struct rank_arg {
    atlas_nccl *nccl;
    const atlas_nccl_id *id;
    int rank;
    float buf[64];
    atlas_status st;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    atlas_nccl_comm *c = NULL;
    a->st = atlas_nccl_comm_init(a->nccl, 2, a->rank, a->id, &c);
    if (a->st == ATLAS_OK) a->st = atlas_nccl_group_start(a->nccl);
    if (a->st == ATLAS_OK)
        a->st = atlas_nccl_all_reduce_sum(c, a->buf, a->buf, 64, ATLAS_DTYPE_F32,
                                          (atlas_nccl_stream)&fake_log);
    if (a->st == ATLAS_OK) a->st = atlas_nccl_group_end(a->nccl);
    if (a->st == ATLAS_OK) a->st = atlas_nccl_comm_destroy(c);
    return NULL;
}

static void scenario_fake(void) {
    /* NCCL_NVLS_ENABLE: unset -> 0 without a note; "0" stays */
    unsetenv("NCCL_NVLS_ENABLE");
    atlas_nccl_fns fns = fake_table();
    atlas_nccl *n = NULL;
    CHECK_OK(atlas_nccl_open_table(&fns, &n));
    CHECK(strcmp(getenv("NCCL_NVLS_ENABLE"), "0") == 0 && strcmp(atlas_nccl_env_note(n), "") == 0);
    CHECK(strcmp(atlas_nccl_path(n), "") == 0 && atlas_nccl_version(n) == 22809);

    /* two ranks, in threads, sum their buffers in place through the wrapper */
    atlas_nccl_id id;
    CHECK_OK(atlas_nccl_unique_id(n, &id));
    pthread_barrier_init(&fake_barrier, NULL, 2);
    rank_arg ranks[2] = {{n, &id, 0, {0}, 0}, {n, &id, 1, {0}, 0}};
    for (int i = 0; i < 64; i++) ranks[0].buf[i] = (float)i, ranks[1].buf[i] = 1000.0f * i;
    pthread_t th[2];
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&fake_barrier);
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(ranks[r].st == ATLAS_OK, "rank %d: %s", r, atlas_status_str(ranks[r].st));
        int bad = 0;
        for (int i = 0; i < 64; i++) bad += ranks[r].buf[i] != 1001.0f * i;
        CHECK(bad == 0);
    }
    CHECK_MSG(strstr(fake_log, "BADID") == NULL, "%s", fake_log);
    /* each rank: init, start, allreduce(64, f32 = 7, sum = 0), end, destroy */
    int inits = 0, reduces = 0, destroys = 0;
    for (const char *s = fake_log; (s = strstr(s, "init(2,")); s++) inits++;
    for (const char *s = fake_log; (s = strstr(s, "allreduce(64,type 7,op 0);")); s++) reduces++;
    for (const char *s = fake_log; (s = strstr(s, "destroy(")); s++) destroys++;
    CHECK_MSG(inits == 2 && reduces == 2 && destroys == 2, "%s", fake_log);
    CHECK_MSG(strncmp(fake_log, "id;", 3) == 0, "%s", fake_log);

    /* one rank alone: the sequence, exactly */
    fake_log[0] = '\0';
    atlas_nccl_comm *c = NULL;
    CHECK_OK(atlas_nccl_comm_init(n, 1, 0, &id, &c));
    CHECK_OK(atlas_nccl_group_start(n));
    uint16_t bf[8] = {0};
    fake_fail_allreduce = 1;
    atlas_status st = atlas_nccl_all_reduce_sum(c, bf, bf, 8, ATLAS_DTYPE_BF16, NULL);
    CHECK_MSG(st == ATLAS_ERR_DEVICE &&
                  strstr(atlas_last_error(), "ncclAllReduce failed: ncclInvalidUsage (invalid "
                                             "usage (fake)): fake: peer went away (nccl.c:"),
              "%s", atlas_last_error());
    fake_fail_allreduce = 0;
    CHECK_OK(atlas_nccl_group_end(n));
    st = atlas_nccl_all_reduce_sum(c, bf, bf, 8, ATLAS_DTYPE_COUNT, NULL);
    CHECK(st == ATLAS_ERR_UNSUPPORTED);
    /* the failed call is still logged; the unsupported dtype never reaches NCCL */
    CHECK_MSG(strcmp(fake_log, "init(1,0);start;allreduce(8,type 9,op 0);end;") == 0, "%s",
              fake_log);
    CHECK(atlas_nccl_close(n) == ATLAS_ERR_BUSY && strstr(atlas_last_error(), "1 communicator"));
    CHECK_OK(atlas_nccl_comm_destroy(c));

    /* NCCL disagreeing on the rank: an internal error, the communicator destroyed */
    fake_log[0] = '\0';
    fake_wrong_rank = 1;
    st = atlas_nccl_comm_init(n, 2, 0, &id, &c);
    CHECK(st == ATLAS_ERR_INTERNAL && c == NULL && strstr(atlas_last_error(), "rank 1 of 2"));
    CHECK_MSG(strstr(fake_log, "destroy(0);"), "%s", fake_log);
    fake_wrong_rank = 0;
    CHECK(atlas_nccl_comm_init(n, 2, 2, &id, &c) == ATLAS_ERR_INVALID);
    CHECK_OK(atlas_nccl_close(n));
    CHECK_OK(atlas_nccl_close(NULL));
    CHECK_OK(atlas_nccl_comm_destroy(NULL));

    /* an old NCCL, an incomplete table, a note when NVLS was asked for */
    fake_version = 2708;
    CHECK(atlas_nccl_open_table(&fns, &n) == ATLAS_ERR_UNSUPPORTED && n == NULL);
    CHECK(strstr(atlas_last_error(), "2.10"));
    fake_version = 22809;
    setenv("NCCL_NVLS_ENABLE", "1", 1);
    CHECK_OK(atlas_nccl_open_table(&fns, &n));
    CHECK(strcmp(getenv("NCCL_NVLS_ENABLE"), "0") == 0 && strstr(atlas_nccl_env_note(n), "was \"1\""));
    CHECK_OK(atlas_nccl_close(n));
    fns.ncclAllReduce = NULL;
    CHECK(atlas_nccl_open_table(&fns, &n) == ATLAS_ERR_INVALID &&
          strstr(atlas_last_error(), "ncclAllReduce is not set"));
}

int main(void) {
    harness_in_child("missing", scenario_missing);
    harness_in_child("not nccl", scenario_not_nccl);
    harness_in_child("default", scenario_default);
    harness_in_child("fake", scenario_fake);
    return harness_finish();
}
