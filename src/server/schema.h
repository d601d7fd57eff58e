/* server/schema.h — a JSON schema (the subset atlas can enforce) as a constraint program,
 * for response_format {"type": "json_schema"}.  Internal to src/server.
 *
 * Enforced: "type" (object, array, string, number, integer, boolean, null, or [T, "null"]),
 * "anyOf" [T's schema, {"type": "null"}], "properties" (every property is written, in the
 * schema's order, each key once: "required" and "additionalProperties" are then satisfied
 * or moot), "items" of a string, number, integer or boolean type (other arrays are any
 * array without "items"; with another "items" schema they are refused), "enum" and "const"
 * (their values as compact JSON), nesting up to ATLAS_SCHEMA_MAX_DEPTH.  Annotations
 * ("description", "title", "default", "examples", "$schema", "$comment") are ignored; any
 * other keyword is refused with its path, never silently ignored.  The root must be an
 * object. */
#ifndef ATLAS_SERVER_SCHEMA_H
#define ATLAS_SERVER_SCHEMA_H

#include <jansson.h>

#include "atlas/constraint.h"
#include "atlas/status.h"

enum { ATLAS_SCHEMA_MAX_DEPTH = 16 };

/* A new program for schema (the caller frees it).  Errors: ATLAS_ERR_UNSUPPORTED or
 * ATLAS_ERR_INVALID naming the keyword's path under where (e.g.
 * "response_format.json_schema.schema.properties.city.pattern"). */
atlas_status atlas_schema_program(const json_t *schema, const char *where,
                                  atlas_constraint **out);

/* The same appended to c (a tool call's arguments inside the call's program).  On failure
 * c may hold part of the schema's segments: the caller frees it. */
atlas_status atlas_schema_append(const json_t *schema, const char *where, atlas_constraint *c);

#endif
