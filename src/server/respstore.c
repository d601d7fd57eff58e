/* server/respstore.c — the stored responses: a list, newest first, under one lock.  A count
 * of a few thousand makes a linear search cheaper than anything the lock would then guard
 * longer; the entries hold deep copies, as jansson's values are not shared across threads. */
#include "server/respstore.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/http.h"

typedef struct entry {
    struct entry *next;
    double t;          /* when it was stored (atlas_http_now) */
    json_t *response, *input, *history;
    char id[];
} entry;

struct atlas_respstore {
    pthread_mutex_t mu;
    entry *head;       /* newest first */
    int count, max_count;
    double max_age_s;
};

static void entry_free(entry *e) {
    json_decref(e->response);
    json_decref(e->input);
    json_decref(e->history);
    free(e);
}

atlas_status atlas_respstore_new(int max_count, int max_age_s, atlas_respstore **out) {
    *out = NULL;
    if (max_count < 0 || max_age_s < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "response store: the count must be >= 0 and the "
                                             "age >= 1 s");
    atlas_respstore *st = calloc(1, sizeof *st);
    if (!st) return atlas_fail(ATLAS_ERR_NOMEM, "response store: out of memory");
    pthread_mutex_init(&st->mu, NULL);
    st->max_count = max_count;
    st->max_age_s = max_age_s;
    *out = st;
    return ATLAS_OK;
}

void atlas_respstore_free(atlas_respstore *st) {
    if (!st) return;
    for (entry *e = st->head, *next; e; e = next) {
        next = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Unlinks (and frees) id's entry, every entry past the count, and every one too old: the
 * list is newest first, so the first too old ends it.  Under the lock. */
static bool prune(atlas_respstore *st, const char *id, double now, int keep) {
    bool found = false;
    int kept = 0;
    entry **pp = &st->head;
    while (*pp) {
        entry *e = *pp;
        bool old = now - e->t > st->max_age_s;
        bool drop = (id && !strcmp(e->id, id)) || old || kept >= keep;
        if (!drop) {
            kept++;
            pp = &e->next;
            continue;
        }
        if (id && !strcmp(e->id, id) && !old) found = true;
        *pp = e->next;
        st->count--;
        entry_free(e);
    }
    return found;
}

atlas_status atlas_respstore_put(atlas_respstore *st, const char *id, const json_t *response,
                                 const json_t *input, const json_t *history) {
    if (!st || st->max_count == 0) return ATLAS_OK;
    size_t n = strlen(id);
    entry *e = calloc(1, sizeof *e + n + 1);
    if (!e) return atlas_fail(ATLAS_ERR_NOMEM, "response store: out of memory");
    memcpy(e->id, id, n + 1);
    e->response = json_deep_copy(response);
    e->input = json_deep_copy(input);
    e->history = json_deep_copy(history);
    if (!e->response || !e->input || !e->history) {
        entry_free(e);
        return atlas_fail(ATLAS_ERR_NOMEM, "response store: out of memory");
    }
    pthread_mutex_lock(&st->mu);
    e->t = atlas_http_now();
    prune(st, id, e->t, st->max_count - 1);
    e->next = st->head;
    st->head = e;
    st->count++;
    pthread_mutex_unlock(&st->mu);
    return ATLAS_OK;
}

/* A deep copy into *out when out is not NULL; false when it ran out of memory. */
static bool copy_out(const json_t *v, json_t **out) {
    if (!out) return true;
    *out = json_deep_copy(v);
    return *out != NULL;
}

atlas_status atlas_respstore_get(atlas_respstore *st, const char *id, json_t **response,
                                 json_t **input, json_t **history) {
    if (response) *response = NULL;
    if (input) *input = NULL;
    if (history) *history = NULL;
    if (!st) return atlas_fail(ATLAS_ERR_NOT_FOUND, "no response '%.100s' is stored", id);
    pthread_mutex_lock(&st->mu);
    prune(st, NULL, atlas_http_now(), st->max_count);
    entry *e = st->head;
    while (e && strcmp(e->id, id) != 0) e = e->next;
    bool ok = !e || (copy_out(e->response, response) && copy_out(e->input, input) &&
                     copy_out(e->history, history));
    pthread_mutex_unlock(&st->mu);
    if (!e) return atlas_fail(ATLAS_ERR_NOT_FOUND, "no response '%.100s' is stored", id);
    if (ok) return ATLAS_OK;
    if (response) json_decref(*response), *response = NULL;
    if (input) json_decref(*input), *input = NULL;
    if (history) json_decref(*history), *history = NULL;
    return atlas_fail(ATLAS_ERR_NOMEM, "response store: out of memory");
}

bool atlas_respstore_delete(atlas_respstore *st, const char *id) {
    if (!st) return false;
    pthread_mutex_lock(&st->mu);
    bool found = prune(st, id, atlas_http_now(), st->max_count);
    pthread_mutex_unlock(&st->mu);
    return found;
}
