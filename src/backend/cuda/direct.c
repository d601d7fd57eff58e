/* backend/cuda/direct.c — see direct.h.
 *
 * Globals (docs/ARCHITECTURE.md, "Globals"): whether a registration was refused in this
 * process and why, under refuse_lock (set once; read without it as a flag). */
#include "backend/cuda/direct.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"

typedef struct direct_job {
    CUdeviceptr dst;
    const char *base; /* the file's mapping: src = base + off */
    int fd;
    uint64_t off;
    size_t bytes;
} direct_job;

enum { PIECE_PENDING, PIECE_REGISTERED, PIECE_STAGE, PIECE_DONE };

typedef struct direct_piece {
    const char *base;
    int fd;
    uint64_t cell;   /* grid index */
    uint64_t lo, hi; /* file offsets, page aligned, inside cell */
    int j0, j1;      /* the sorted jobs that may touch it */
    int stage;       /* staged by choice (stage_pct) */
    int state;       /* PIECE_*, under the run's lock */
    int issued;      /* its copies are queued (or it is staged) */
    int reaped;      /* unregistered (or staged): its window slot is free */
} direct_piece;

struct atlas_direct {
    atlas_host *host;
    atlas_direct_opts opts;
    size_t page;
    atlas_direct_stage_fn stage;
    void *user;
    direct_job *jobs;
    int n_jobs, cap_jobs;
};

static pthread_mutex_t refuse_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int refused;
static char refuse_reason[300];

const char *atlas_direct_refused(void) { return atomic_load(&refused) ? refuse_reason : ""; }

static void refuse(const char *why) {
    pthread_mutex_lock(&refuse_lock);
    if (!atomic_load(&refused)) {
        snprintf(refuse_reason, sizeof refuse_reason, "%s", why);
        atomic_store(&refused, 1);
    }
    pthread_mutex_unlock(&refuse_lock);
}

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

bool atlas_direct_eligible(const void *src, int fd, uint64_t file_off) {
    if (fd < 0 || !src || atomic_load(&refused)) return false;
    uintptr_t base = (uintptr_t)src - (uintptr_t)file_off;
    return base % page_size() == 0;
}

atlas_status atlas_direct_create(atlas_host *host, const atlas_direct_opts *opts,
                                 atlas_direct_stage_fn stage, void *user, atlas_direct **out) {
    *out = NULL;
    atlas_direct *d = calloc(1, sizeof *d);
    if (!d) return atlas_fail(ATLAS_ERR_NOMEM, "direct load: out of memory");
    d->host = host;
    d->opts = *opts;
    d->page = page_size();
    d->stage = stage;
    d->user = user;
    atlas_direct_opts *o = &d->opts;
    if (o->piece_bytes == 0) o->piece_bytes = ATLAS_DIRECT_PIECE;
    o->piece_bytes = (o->piece_bytes + d->page - 1) / d->page * d->page;
    if (o->threads < 1) o->threads = ATLAS_DIRECT_THREADS;
    if (o->threads > 64) o->threads = 64;
    if (o->window < 1) o->window = 2 * o->threads + 2;
    if (o->stage_pct < 0) o->stage_pct = 0;
    if (o->stage_pct > 100) o->stage_pct = 100;
    *out = d;
    return ATLAS_OK;
}

void atlas_direct_free(atlas_direct *d) {
    if (!d) return;
    free(d->jobs);
    free(d);
}

atlas_status atlas_direct_add(atlas_direct *d, CUdeviceptr dst, const void *src, int fd,
                              uint64_t file_off, size_t bytes) {
    if (bytes == 0) return ATLAS_OK;
    if (d->n_jobs == d->cap_jobs) {
        int cap = d->cap_jobs ? 2 * d->cap_jobs : 256;
        direct_job *j = realloc(d->jobs, (size_t)cap * sizeof *j);
        if (!j) return atlas_fail(ATLAS_ERR_NOMEM, "direct load: out of memory");
        d->jobs = j;
        d->cap_jobs = cap;
    }
    d->jobs[d->n_jobs++] = (direct_job){dst, (const char *)src - file_off, fd, file_off, bytes};
    return ATLAS_OK;
}

void atlas_direct_drop(atlas_direct *d, CUdeviceptr lo, CUdeviceptr hi) {
    if (!d) return;
    int k = 0;
    for (int i = 0; i < d->n_jobs; i++)
        if (d->jobs[i].dst < lo || d->jobs[i].dst >= hi) d->jobs[k++] = d->jobs[i];
    d->n_jobs = k;
}

size_t atlas_direct_queued_bytes(const atlas_direct *d) {
    size_t n = 0;
    for (int i = 0; d && i < d->n_jobs; i++) n += d->jobs[i].bytes;
    return n;
}

/* --- the plan: jobs in file order, pieces on the grid ---------------------------------------- */

static int job_cmp(const void *a, const void *b) {
    const direct_job *x = a, *y = b;
    if (x->base != y->base) return (uintptr_t)x->base < (uintptr_t)y->base ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Pieces of the sorted jobs: one per (file, cell) touched, covering the pages touched. Jobs
 * start in order, so the cells of one job that already have pieces are a run at the end of
 * the file's pieces (every earlier job reaching this job's first cell covers the cells from
 * there to its end). */
static atlas_status plan(atlas_direct *d, direct_piece **out, int *n_out) {
    qsort(d->jobs, (size_t)d->n_jobs, sizeof *d->jobs, job_cmp);
    size_t P = d->opts.piece_bytes, pg = d->page;
    direct_piece *ps = NULL;
    int n = 0, cap = 0, file0 = 0; /* pieces of the current file start at file0 */
    for (int j = 0; j < d->n_jobs; j++) {
        const direct_job *jb = &d->jobs[j];
        if (j && jb->base != d->jobs[j - 1].base) file0 = n;
        uint64_t end = jb->off + jb->bytes;
        uint64_t c0 = jb->off / P, c1 = (end - 1) / P;
        int k = n;
        while (k > file0 && ps[k - 1].cell >= c0) k--; /* first existing piece at >= c0 */
        for (uint64_t c = c0; c <= c1; c++) {
            uint64_t lo = jb->off > c * P ? jb->off : c * P;
            uint64_t hi = end < (c + 1) * P ? end : (c + 1) * P;
            lo = lo / pg * pg;
            hi = (hi + pg - 1) / pg * pg;
            if (k < n && ps[k].cell == c) {
                direct_piece *p = &ps[k++];
                if (lo < p->lo) p->lo = lo;
                if (hi > p->hi) p->hi = hi;
                if (j + 1 > p->j1) p->j1 = j + 1;
                continue;
            }
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                direct_piece *g = realloc(ps, (size_t)cap * sizeof *g);
                if (!g) {
                    free(ps);
                    return atlas_fail(ATLAS_ERR_NOMEM, "direct load: out of memory");
                }
                ps = g;
            }
            ps[n++] = (direct_piece){jb->base, jb->fd, c, lo, hi, j, j + 1, 0, PIECE_PENDING, 0, 0};
            k = n;
        }
    }
    int pct = d->opts.stage_pct;
    for (int i = 0; i < n; i++) /* spread evenly: piece i is staged when the share steps */
        ps[i].stage = (int)((int64_t)(i + 1) * pct / 100 - (int64_t)i * pct / 100);
    *out = ps;
    *n_out = n;
    return ATLAS_OK;
}

/* The part of job j inside piece p: file offsets [*a, *b); false when none. */
static bool overlap(const direct_job *j, const direct_piece *p, uint64_t *a, uint64_t *b) {
    if (j->base != p->base) return false;
    uint64_t lo = j->off > p->lo ? j->off : p->lo, e = j->off + j->bytes;
    uint64_t hi = e < p->hi ? e : p->hi;
    *a = lo, *b = hi;
    return lo < hi;
}

/* --- the run ------------------------------------------------------------------------------- */

typedef struct direct_run {
    atlas_direct *d;
    direct_piece *ps;
    int n;
    CUstream stream;
    CUevent *events; /* [window]: piece i records events[i % window] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int next;        /* next piece to register */
    int next_reap;   /* next piece to unregister */
    int done;        /* pieces 0..done-1 unregistered or staged */
    int stop;        /* an error: everyone leaves */
    atlas_status st; /* the first error, its message in msg */
    char msg[1024];
    size_t direct_bytes, staged_bytes;
    int pieces_staged;
} direct_run;

/* Keeps the first error (this thread's message) and stops the run. Under mu. */
static void run_fail_locked(direct_run *r, atlas_status st) {
    if (r->st == ATLAS_OK) {
        r->st = st;
        snprintf(r->msg, sizeof r->msg, "%s", atlas_last_error());
    }
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
}

static void run_fail(direct_run *r, atlas_status st) {
    pthread_mutex_lock(&r->mu);
    run_fail_locked(r, st);
    pthread_mutex_unlock(&r->mu);
}

static void set_state(direct_run *r, int i, int state) {
    pthread_mutex_lock(&r->mu);
    r->ps[i].state = state;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* A piece's step failed: st wrapped with what and where, then the run stops. */
static void run_fail_piece(direct_run *r, atlas_status st, const char *what, int i, uint64_t a,
                           uint64_t b) {
    pthread_mutex_lock(&r->mu);
    atlas_fail_wrap(st, "direct load: %s piece %d (file offsets %llu..%llu)", what, i,
                    (unsigned long long)a, (unsigned long long)b);
    run_fail_locked(r, st);
    pthread_mutex_unlock(&r->mu);
}

/* Waits until piece p is registered or to be staged; false when the run stopped. */
static bool wait_settled(direct_run *r, const direct_piece *p, int *state) {
    pthread_mutex_lock(&r->mu);
    while (!r->stop && p->state == PIECE_PENDING) pthread_cond_wait(&r->cv, &r->mu);
    int stop = r->stop;
    *state = p->state;
    pthread_mutex_unlock(&r->mu);
    return !stop;
}

/* A worker thread's start: the host's context current on it, or the run failed. */
static bool thread_enter(direct_run *r) {
    atlas_status st = atlas_host_make_current(r->d->host);
    if (st != ATLAS_OK) run_fail(r, st);
    return st == ATLAS_OK;
}

/* Registers the pieces in order, window pieces ahead of the reaper at most. */
static void *registrar(void *arg) {
    direct_run *r = arg;
    const atlas_driver *drv = atlas_driver_get();
    if (!thread_enter(r)) return NULL;
    int window = r->d->opts.window;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->stop && r->next < r->n && r->next >= r->done + window)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop || r->next >= r->n) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        int i = r->next++;
        pthread_mutex_unlock(&r->mu);
        direct_piece *p = &r->ps[i];
        if (p->stage || atomic_load(&refused)) {
            set_state(r, i, PIECE_STAGE);
            continue;
        }
        CUresult res = drv->cuMemHostRegister((void *)(p->base + p->lo), p->hi - p->lo,
                                              ATLAS_CU_MEMHOSTREGISTER_READ_ONLY);
        if (res != ATLAS_CUDA_SUCCESS) { /* not an error: the rest goes through staging */
            char why[300];
            snprintf(why, sizeof why, "cuMemHostRegister(read-only, %zu bytes of a file "
                     "mapping) failed: %s", (size_t)(p->hi - p->lo), atlas_cu_error_name(res));
            refuse(why);
            set_state(r, i, PIECE_STAGE);
            continue;
        }
        set_state(r, i, PIECE_REGISTERED);
    }
}

/* Takes the pieces in order: waits for a registered piece's copies, then unregisters it
 * (several reapers: unregistering may cost as much as registering). */
static void *reaper(void *arg) {
    direct_run *r = arg;
    if (!thread_enter(r)) return NULL;
    int window = r->d->opts.window;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->stop && r->next_reap < r->n && !r->ps[r->next_reap].issued)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop || r->next_reap >= r->n) { /* at a stop the caller unregisters the rest */
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        int i = r->next_reap++;
        direct_piece *p = &r->ps[i];
        int state = p->state;
        pthread_mutex_unlock(&r->mu);
        if (state == PIECE_REGISTERED) {
            atlas_status st = ATLAS_CU(cuEventSynchronize, r->events[i % window]);
            if (st == ATLAS_OK)
                st = ATLAS_CU(cuMemHostUnregister, (void *)(p->base + p->lo));
            if (st != ATLAS_OK) { /* still registered: run_pieces unregisters it */
                run_fail_piece(r, st, "unregistering", i, p->lo, p->hi);
                return NULL;
            }
        }
        pthread_mutex_lock(&r->mu);
        if (state == PIECE_REGISTERED) p->state = PIECE_DONE;
        p->reaped = 1;
        while (r->done < r->n && r->ps[r->done].reaped) r->done++;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Copies the staged pieces through the staging pool, in order. */
static void *stager(void *arg) {
    direct_run *r = arg;
    atlas_direct *d = r->d;
    for (int i = 0; i < r->n; i++) {
        direct_piece *p = &r->ps[i];
        int state;
        if (!wait_settled(r, p, &state)) return NULL;
        if (state != PIECE_STAGE) continue;
        size_t bytes = 0;
        for (int j = p->j0; j < p->j1; j++) {
            const direct_job *jb = &d->jobs[j];
            uint64_t a, b;
            if (!overlap(jb, p, &a, &b)) continue;
            atlas_status st = d->stage(d->user, jb->dst + (a - jb->off), jb->base + a, jb->fd, a,
                                       (size_t)(b - a));
            if (st != ATLAS_OK) {
                run_fail_piece(r, st, "staging", i, a, b);
                return NULL;
            }
            bytes += (size_t)(b - a);
        }
        pthread_mutex_lock(&r->mu);
        r->staged_bytes += bytes;
        r->pieces_staged++;
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* The calling thread: queues each registered piece's copies as soon as it is registered. */
static void issue(direct_run *r) {
    atlas_direct *d = r->d;
    int window = d->opts.window;
    for (int i = 0; i < r->n; i++) {
        direct_piece *p = &r->ps[i];
        int state;
        if (!wait_settled(r, p, &state)) return;
        atlas_status st = ATLAS_OK;
        size_t bytes = 0;
        for (int j = p->j0; state == PIECE_REGISTERED && st == ATLAS_OK && j < p->j1; j++) {
            const direct_job *jb = &d->jobs[j];
            uint64_t a, b;
            if (!overlap(jb, p, &a, &b)) continue;
            st = ATLAS_CU(cuMemcpyHtoDAsync, jb->dst + (a - jb->off), jb->base + a,
                          (size_t)(b - a), r->stream);
            bytes += (size_t)(b - a);
        }
        if (state == PIECE_REGISTERED && st == ATLAS_OK)
            st = ATLAS_CU(cuEventRecord, r->events[i % window], r->stream);
        if (st != ATLAS_OK) {
            run_fail_piece(r, st, "copying", i, p->lo, p->hi);
            return;
        }
        pthread_mutex_lock(&r->mu);
        r->direct_bytes += bytes;
        p->issued = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Everything the threads need, then the threads; joins them and cleans up whatever state
 * they left (an error: copies drained, then every piece still registered unregistered). */
static atlas_status run_pieces(atlas_direct *d, direct_run *r) {
    const atlas_driver *drv = atlas_driver_get();
    int window = d->opts.window;
    atlas_status st = ATLAS_CU(cuStreamCreate, &r->stream, ATLAS_CU_STREAM_NON_BLOCKING);
    r->events = calloc((size_t)window, sizeof *r->events);
    if (st == ATLAS_OK && !r->events) st = atlas_fail(ATLAS_ERR_NOMEM, "direct load: out of memory");
    for (int i = 0; st == ATLAS_OK && i < window; i++)
        st = ATLAS_CU(cuEventCreate, &r->events[i], ATLAS_CU_EVENT_DISABLE_TIMING);
    int nt = d->opts.threads < r->n ? d->opts.threads : r->n;
    int nr = (nt + 3) / 4; /* reapers */
    pthread_t regs[64], reaps[16], stg;
    int n_regs = 0, n_reaps = 0, have_stg = 0;
    if (st == ATLAS_OK) {
        for (; n_regs < nt; n_regs++)
            if (pthread_create(&regs[n_regs], NULL, registrar, r) != 0) break;
        for (; n_reaps < nr; n_reaps++)
            if (pthread_create(&reaps[n_reaps], NULL, reaper, r) != 0) break;
        have_stg = pthread_create(&stg, NULL, stager, r) == 0;
        if (n_regs == 0 || n_reaps == 0 || !have_stg)
            run_fail(r, atlas_fail(ATLAS_ERR_NOMEM, "direct load: cannot start threads"));
        else
            issue(r);
    }
    for (int i = 0; i < n_regs; i++) pthread_join(regs[i], NULL);
    if (have_stg) pthread_join(stg, NULL);
    for (int i = 0; i < n_reaps; i++) pthread_join(reaps[i], NULL); /* after the last piece */
    /* what is left registered (a stop): its copies drained first */
    atlas_status fin = ATLAS_OK;
    if (r->stream) fin = ATLAS_CU(cuStreamSynchronize, r->stream);
    for (int i = 0; i < r->n; i++)
        if (r->ps[i].state == PIECE_REGISTERED) {
            CUresult res = drv->cuMemHostUnregister((void *)(r->ps[i].base + r->ps[i].lo));
            if (res != ATLAS_CUDA_SUCCESS && fin == ATLAS_OK)
                fin = atlas_fail(ATLAS_ERR_DEVICE, "direct load: cuMemHostUnregister of piece %d "
                                 "failed: %s", i, atlas_cu_error_name(res));
            r->ps[i].state = PIECE_DONE;
        }
    if (fin == ATLAS_OK && r->st == ATLAS_OK) fin = atlas_host_upload_wait(d->host); /* staged */
    for (int i = 0; r->events && i < window; i++)
        if (r->events[i]) drv->cuEventDestroy(r->events[i]);
    free(r->events);
    if (r->stream) drv->cuStreamDestroy(r->stream);
    if (st != ATLAS_OK) return st;
    if (r->st != ATLAS_OK) return atlas_fail(r->st, "%s", r->msg);
    return fin;
}

void atlas_direct_stats_add(atlas_direct_stats *sum, const atlas_direct_stats *s) {
    sum->direct_bytes += s->direct_bytes;
    sum->staged_bytes += s->staged_bytes;
    sum->pieces += s->pieces;
    sum->pieces_staged += s->pieces_staged;
    sum->piece_bytes = s->piece_bytes;
    sum->threads = s->threads;
    sum->window = s->window;
    sum->ms += s->ms;
}

atlas_status atlas_direct_run(atlas_direct *d, atlas_direct_stats *stats) {
    double t0 = atlas_now_ms();
    if (stats) memset(stats, 0, sizeof *stats);
    if (!d || d->n_jobs == 0) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(d->host));
    direct_run r;
    memset(&r, 0, sizeof r);
    r.d = d;
    atlas_status st = plan(d, &r.ps, &r.n);
    if (st == ATLAS_OK) {
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        st = run_pieces(d, &r);
        pthread_mutex_destroy(&r.mu);
        pthread_cond_destroy(&r.cv);
    }
    if (stats) {
        stats->direct_bytes = r.direct_bytes;
        stats->staged_bytes = r.staged_bytes;
        stats->pieces = r.n;
        stats->pieces_staged = r.pieces_staged;
        stats->piece_bytes = d->opts.piece_bytes;
        stats->threads = d->opts.threads;
        stats->window = d->opts.window;
        stats->ms = atlas_now_ms() - t0;
    }
    free(r.ps);
    d->n_jobs = 0;
    return st;
}
