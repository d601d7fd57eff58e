/* server/respstore.h — the stored responses of POST /v1/responses, in memory: each under its
 * id with the response object, the input items it was given and the whole conversation up to
 * and including its output (what previous_response_id continues).  Bounded by a count (the
 * oldest goes first) and an age (an older one is gone as if deleted).  Thread-safe: every
 * request thread puts, gets and deletes; what goes in and comes out are copies.  Internal to
 * src/server. */
#ifndef ATLAS_SERVER_RESPSTORE_H
#define ATLAS_SERVER_RESPSTORE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "atlas/status.h"

typedef struct atlas_respstore atlas_respstore;

/* max_count 0: nothing is stored (a put is dropped); max_age_s: seconds a response is kept. */
atlas_status atlas_respstore_new(int max_count, int max_age_s, atlas_respstore **out);
void atlas_respstore_free(atlas_respstore *st); /* NULL: no-op */

/* Stores copies under id (replacing one of that id), dropping what is too old or too many. */
atlas_status atlas_respstore_put(atlas_respstore *st, const char *id, const json_t *response,
                                 const json_t *input, const json_t *history);

/* Copies of what id holds into those of response, input, history that are not NULL (the
 * caller decrefs them); ATLAS_ERR_NOT_FOUND when id is not there (or too old). */
atlas_status atlas_respstore_get(atlas_respstore *st, const char *id, json_t **response,
                                 json_t **input, json_t **history);

/* Removes id; false when it was not there. */
bool atlas_respstore_delete(atlas_respstore *st, const char *id);

#endif
