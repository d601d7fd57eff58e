/* tests/engine_wait.c — see engine_wait.h. */
#include "engine_wait.h"

static void on_event(const atlas_event *ev, void *user) {
    engine_wait *w = user;
    pthread_mutex_lock(&w->mu);
    w->on(ev, w->user);
    if (ev->type == ATLAS_EVENT_END) {
        w->done = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

atlas_status engine_wait_submit(engine_wait *w, atlas_engine *e, const atlas_request *r,
                                void (*on)(const atlas_event *ev, void *user), void *user) {
    *w = (engine_wait){.on = on, .user = user};
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    atlas_status st = atlas_engine_submit(e, r, on_event, w, NULL);
    if (st != ATLAS_OK) w->done = 1; /* no event will come */
    return st;
}

void engine_wait_end(engine_wait *w) {
    pthread_mutex_lock(&w->mu);
    while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

atlas_status engine_wait_run(atlas_engine *e, const atlas_request *r,
                             void (*on)(const atlas_event *ev, void *user), void *user) {
    engine_wait w;
    atlas_status st = engine_wait_submit(&w, e, r, on, user);
    engine_wait_end(&w);
    return st;
}
