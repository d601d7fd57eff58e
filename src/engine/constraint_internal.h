/* engine/constraint_internal.h — the data of constraint programs, shared by the builder
 * (constraint_program.c) and the matcher (constraint.c).  Internal.
 *
 * A program is a flat array of segments.  Alternatives (a SWITCH, or the triggers of FREE
 * text) are laid out after the segment that chooses among them: option k's key is matched
 * by the SWITCH or FREE segment itself, the rest of its alternative follows from
 * target[k], and a JUMP at the end of each alternative goes on after the last one (SWITCH)
 * or back to the free text (FREE). */
#ifndef ATLAS_CONSTRAINT_INTERNAL_H
#define ATLAS_CONSTRAINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/constraint.h"

typedef enum seg_kind {
    SEG_LITERAL = 0,
    SEG_CHOICE,
    SEG_JSON,
    SEG_SWITCH, /* one of n keys, then that alternative's segments from target[k] */
    SEG_FREE,   /* any text; a key (a trigger) then goes on at target[k] */
    SEG_JUMP,   /* matches nothing: goes on at jump */
} seg_kind;

typedef struct seg {
    seg_kind kind;
    char *lit;          /* LITERAL: [len] bytes */
    size_t len;
    char **opt;         /* CHOICE, SWITCH, FREE: [n_opt] NUL-terminated, sorted (bytewise),
                           unique (SWITCH, FREE: none a prefix of another) */
    size_t *opt_len;
    int n_opt;
    int *target;        /* SWITCH, FREE: [n_opt] the segment after option k's key */
    int has_prefix;     /* CHOICE: some option is a proper prefix of another */
    uint8_t cont[32];   /* CHOICE: bit b: some option continues another with b; FREE: bit b:
                           some trigger starts with b */
    atlas_constraint_json_kind jkind; /* JSON */
    int nullable;       /* JSON: null instead of the value */
    int tight;          /* JSON: no whitespace before the value (the literal before it ends
                           in some) */
    int jump;           /* JUMP */
} seg;

struct atlas_constraint {
    seg *segs;
    int n;
    int closed; /* it has FREE text, which goes on for ever: nothing may be added after it */
};

static inline int constraint_bit(const uint8_t *set, unsigned b) {
    return set[b >> 3] >> (b & 7) & 1;
}

/* ATLAS_OK when the program may end with its last segment (constraint_program.c). */
atlas_status constraint_check_end(const atlas_constraint *c);

#endif
