/* backend/cpu/cpu_read.c — the weights' reads, queued by weight_load and run by weights_done
 * on every thread of the backend's pool (cpu.h).
 *
 * A weight is read into memory of its own (never the checkpoint's mapping: a truncated file
 * would be SIGBUS there), and the time of that read goes mostly to the first touch of the
 * new pages inside pread (the kernel zeroing them; under a hypervisor, backing them), not
 * to the copy. One thread does that at a fraction of what the page cache gives, so the
 * reads are cut into pieces that each thread takes in turn. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"

/* A piece is whole huge pages (weight_bytes aligns a large weight's copy to 2 MiB), so no
 * two threads fault on the same huge page, and large enough that taking one is nothing. */
enum { CPU_READ_PIECE = 4 << 20 };

struct cpu_read {
    const atlas_weight *owner; /* dropped with it by cpu_read_cancel */
    atlas_status (*read)(void *ctx, void *dst, uint64_t offset, size_t n);
    void *ctx;
    char *dst;
    uint64_t offset; /* in the source */
    size_t n;
    char name[96];   /* the tensor's, for the error */
};

atlas_status cpu_read_queue(cpu_backend *cb, const atlas_weight *owner,
                            const atlas_weight_src *v, void *dst) {
    size_t pieces = (v->nbytes + CPU_READ_PIECE - 1) / CPU_READ_PIECE;
    if (cb->n_reads + pieces > cb->cap_reads) {
        size_t cap = cb->cap_reads ? 2 * cb->cap_reads : 256;
        while (cap < cb->n_reads + pieces) cap *= 2;
        cpu_read *grown = realloc(cb->reads, cap * sizeof *grown);
        if (!grown) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", v->name);
        cb->reads = grown;
        cb->cap_reads = cap;
    }
    for (size_t off = 0; off < v->nbytes; off += CPU_READ_PIECE) {
        cpu_read *r = &cb->reads[cb->n_reads++];
        *r = (cpu_read){.owner = owner, .read = v->read, .ctx = v->ctx, .dst = (char *)dst + off,
                        .offset = off, .n = v->nbytes - off < CPU_READ_PIECE
                                                ? v->nbytes - off : CPU_READ_PIECE};
        snprintf(r->name, sizeof r->name, "%s", v->name);
    }
    return ATLAS_OK;
}

void cpu_read_cancel(cpu_backend *cb, const atlas_weight *owner) {
    size_t kept = 0;
    for (size_t i = 0; i < cb->n_reads; i++)
        if (cb->reads[i].owner != owner) cb->reads[kept++] = cb->reads[i];
    cb->n_reads = kept;
}

typedef struct read_job {
    cpu_backend *cb;
    atomic_size_t next;  /* the next piece to take */
    atomic_int failed;   /* set by the first failure: the others stop taking pieces */
    atlas_status st;     /* the first failure's status and message (its thread's) */
    char why[512];
} read_job;

/* One call a thread: takes pieces until none is left or one has failed. */
static void read_pieces(void *ctx, int64_t begin, int64_t end, int thread) {
    read_job *j = ctx;
    (void)begin, (void)end, (void)thread;
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->cb->n_reads || atomic_load(&j->failed)) return;
        const cpu_read *r = &j->cb->reads[i];
        atlas_status st = r->read(r->ctx, r->dst, r->offset, r->n);
        if (st != ATLAS_OK && !atomic_exchange(&j->failed, 1)) {
            j->st = st;
            snprintf(j->why, sizeof j->why, "reading weight %s: %s", r->name,
                     atlas_last_error());
        }
    }
}

atlas_status cpu_read_run(cpu_backend *cb) {
    if (!cb->n_reads) return ATLAS_OK;
    read_job j = {.cb = cb, .st = ATLAS_OK};
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, 0);
    atlas_threadpool_for(cb->pool, cb->n_threads, 1, read_pieces, &j);
    /* after a failure every read stays queued: a weight read in part is never used, each
     * later run fails again until the weights are freed (which drops their reads) */
    if (j.st != ATLAS_OK) return atlas_fail(j.st, "%s", j.why);
    cb->n_reads = 0;
    return ATLAS_OK;
}
