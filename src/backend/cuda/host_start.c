/* backend/cuda/host_start.c — atlas_host_start (atlas/host.h): the host's set-up on threads
 * of its own, so that a process's first load does its file work (config, tokenizer, headers,
 * the page cache's survey) while the driver, the context, the staging pool and cuBLASLt come
 * up.  Nothing here is kept: what the threads make is the host's (host.c) and cuBLASLt's
 * library (cublaslt.c), each behind its own lock, so a caller that needs one before the
 * thread made it waits on that lock or makes it itself.
 *
 * Globals (docs/ARCHITECTURE.md, "Globals"): the count of its threads still running, under
 * its lock, so that a process about to exit can wait for them (atlas_host_start_wait). */
#include <pthread.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"
#include "core/error.h"

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t start_done = PTHREAD_COND_INITIALIZER;
static int start_running;

static void start_end(void) {
    pthread_mutex_lock(&start_lock);
    if (--start_running == 0) pthread_cond_broadcast(&start_done);
    pthread_mutex_unlock(&start_lock);
}

/* Binds the host (atlas_host_get, under the host's lock: a load's own atlas_host_get waits for
 * it) and then fills the staging pool.  A failure is left for the next atlas_host_get or the
 * first upload, which try again and report it on their own thread. */
static void *start_host(void *arg) {
    atlas_host *h = NULL;
    if (atlas_host_get((int)(intptr_t)arg, &h) == ATLAS_OK) (void)atlas_host_prepare_staging(h);
    atlas_error_clear();
    start_end();
    return NULL;
}

/* cuBLASLt's library needs no context: it opens once the driver is there (it waits on the
 * driver's lock while the other thread loads it), beside the context and the staging pool.
 * Without a driver it is not opened at all: a large library that a process on the CPU has no
 * use for, and one it would be still opening at exit.  Its absence is said by the model that
 * looks for it. */
static void *start_cublaslt(void *arg) {
    (void)arg;
    if (atlas_driver_load(NULL) == ATLAS_OK) (void)cuda_lt_open_library();
    atlas_error_clear();
    start_end();
    return NULL;
}

void atlas_host_start(int ordinal) {
    if (ordinal < 0) return; /* atlas_host_get says so */
    atlas_host_mark_begin();
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    void *(*const mains[2])(void *) = {start_host, start_cublaslt};
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&start_lock);
        start_running++;
        pthread_mutex_unlock(&start_lock);
        if (pthread_create(&t, &attr, mains[i], (void *)(intptr_t)ordinal) != 0) start_end();
    }
    pthread_attr_destroy(&attr);
}

void atlas_host_start_wait(void) {
    pthread_mutex_lock(&start_lock);
    while (start_running > 0) pthread_cond_wait(&start_done, &start_lock);
    pthread_mutex_unlock(&start_lock);
}
