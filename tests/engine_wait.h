/* tests/engine_wait.h — requests run through the engine to their end: each request's events
 * handed to the test's callback one at a time, and a wait for its end event. */
#ifndef ATLAS_TEST_ENGINE_WAIT_H
#define ATLAS_TEST_ENGINE_WAIT_H

#include <pthread.h>

#include "atlas/engine.h"

typedef struct engine_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    void (*on)(const atlas_event *ev, void *user);
    void *user;
} engine_wait;

/* Submits r; its events go to on(ev, user) under w's lock. A refused submit is returned
 * (engine_wait_end then returns at once). */
atlas_status engine_wait_submit(engine_wait *w, atlas_engine *e, const atlas_request *r,
                                void (*on)(const atlas_event *ev, void *user), void *user);
/* Returns once w's request has had ATLAS_EVENT_END handled; w may then be reused. */
void engine_wait_end(engine_wait *w);
/* Both: one request, submitted and waited for. */
atlas_status engine_wait_run(atlas_engine *e, const atlas_request *r,
                             void (*on)(const atlas_event *ev, void *user), void *user);

#endif
