/* core/threadpool.c — see threadpool.h.
 *
 * One mutex and two condition variables: `wake` starts a job (the generation counter tells
 * a worker that a new one is posted), `done` tells the caller that the last range finished.
 * Both sides spin a little first (SPIN_ROUNDS, about a tenth of a millisecond): a decode step
 * posts a job every few microseconds, and a sleeping thread's wake-up (a futex, a VM's
 * interrupt) took a tenth of the step's time on a 2-core VM. Ranges are fixed per thread
 * (static split): the ops are uniform, and a fixed split keeps results reproducible run to
 * run. */
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#endif

#include "core/error.h"

typedef struct worker {
    atlas_threadpool *pool;
    pthread_t thread;
    int index;
} worker;

struct atlas_threadpool {
    int n_threads;
    int n_started;
    worker *workers; /* [n_threads - 1]: index 1.. */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t generation;
    atomic_int pending; /* workers still running the current job */
    atomic_bool stop;
    /* the current job */
    atlas_parallel_fn fn;
    void *ctx;
    int64_t n;
    int parts;
};

static void run_part(atlas_threadpool *p, int part) {
    if (part >= p->parts) return;
    int64_t begin = p->n * part / p->parts;
    int64_t end = p->n * (part + 1) / p->parts;
    if (begin < end) p->fn(p->ctx, begin, end, part);
}

enum { SPIN_ROUNDS = 4096 };

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Spins until *gen differs from seen or the pool stops; 1 when either happened. */
static int spin_for_job(atlas_threadpool *p, uint64_t seen) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return 1;
        cpu_relax();
    }
    return 0;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    atlas_threadpool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_for_job(p, seen)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        run_part(p, w->index);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            /* under the mutex: the caller checks pending under it before it waits */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int atlas_cores(int most) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > most ? most : (int)cores;
}

int atlas_cores_spare(int most) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN) - 1;
    return cores < 1 ? 1 : cores > most ? most : (int)cores;
}

void atlas_thread_background(void) {
#ifdef __linux__
    /* Linux's nice is per thread (a task id); best effort, as a failure only costs latency */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
#endif
}

atlas_status atlas_threadpool_create(int n_threads, atlas_threadpool **out) {
    *out = NULL;
    if (n_threads < 0) return atlas_fail(ATLAS_ERR_INVALID, "thread pool: %d threads", n_threads);
    if (n_threads == 0) n_threads = atlas_cores(256);
    atlas_threadpool *p = calloc(1, sizeof *p);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            atlas_threadpool_free(p);
            return atlas_fail(ATLAS_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->index = i;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            atlas_threadpool_free(p);
            return atlas_fail(ATLAS_ERR_NOMEM, "thread pool: starting thread %d of %d: %s", i,
                              n_threads, strerror(rc));
        }
        p->n_started = i;
    }
    *out = p;
    return ATLAS_OK;
}

void atlas_threadpool_free(atlas_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i - 1].thread, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int atlas_threadpool_size(const atlas_threadpool *p) { return p ? p->n_threads : 1; }

void atlas_threadpool_for(atlas_threadpool *p, int64_t n, int64_t min_chunk,
                          atlas_parallel_fn fn, void *ctx) {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    int64_t parts = n / min_chunk;
    if (!p || parts > p->n_threads) parts = p ? p->n_threads : 1;
    if (parts <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->parts = (int)parts;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_part(p, 0);
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
