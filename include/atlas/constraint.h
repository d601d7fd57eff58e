/* atlas/constraint.h — constrained decoding: a program the generated text must follow, and a
 * matcher that says which tokens may come next.
 *
 * A program is a sequence of segments matched in order:
 *   LITERAL      exactly these bytes;
 *   CHOICE       exactly one of n strings;
 *   JSON_OBJECT  one JSON object (RFC 8259), with limits so that a model cannot run away and
 *                every completed object parses with common parsers (jansson included):
 *                nesting at most ATLAS_CONSTRAINT_MAX_DEPTH; whitespace outside strings as
 *                llama.cpp's JSON grammar has it (none, one space, or one newline and at
 *                most ATLAS_CONSTRAINT_MAX_INDENT spaces or tabs, between any two tokens),
 *                strings of valid UTF-8 with valid escapes (surrogates paired, no \u0000),
 *                integer parts of at most 18 digits and exponents of at most 2 (so that
 *                integers fit 64 bits and reals a double).  Leading whitespace is allowed
 *                (by the same rule), unless the literal before ends in whitespace ('"a": '
 *                then a value: none more); the object ends at its closing brace.
 *   JSON value   the same grammar for one value of a kind (atlas_constraint_json_kind):
 *                any value, an array, a string, a number, an integer, a boolean, an array
 *                of one of these four; null allowed or not.
 *   ALTERNATIVES one of n keys (strings, no key a prefix of another), each followed by its
 *                own program: the text goes on with the program of the key it starts with.
 *   FREE TEXT    any bytes, in which each appearance of a trigger (one of n keys, as
 *                above) goes on with that key's program, then free text again
 *                (OpenAI's strict tools under tool_choice "auto": free text, but a call of
 *                a strict tool, once its name is written, follows the tool's schema).  It
 *                never completes: it is the last segment, and tokens without bytes (special
 *                ones, eos) are allowed in it, so the sequence ends as unconstrained text
 *                does (atlas_constraint_matcher_can_end).  A trigger is found in the text
 *                whatever comes before it, overlapping starts included.
 * The program is complete when the last segment is.  Matching is deterministic: a CHOICE
 * where one option is a proper prefix of another must be followed by a LITERAL whose first
 * byte cannot continue the longer option, and a value that may be a number (ANY, NUMBER,
 * INTEGER), which only ends at the first byte that is not its own, must be followed by a
 * LITERAL that does not start with a digit, '.', 'e', 'E', '+' or '-' (the builder refuses
 * anything else), so that one byte never leaves two ways to go on.  Consecutive literals
 * are merged into one segment.
 *
 * A vocabulary is every token's bytes, sorted once so that tokens sharing a prefix walk it
 * once per step (a 150k vocabulary masks in a few milliseconds at most on one core).  A matcher is one
 * sequence's position in a program; it computes the allowed tokens and advances by the
 * chosen one.
 *
 * Threads: a program and a vocabulary are immutable once built and may be shared (building
 * one, with the add_ calls, belongs to one thread); a matcher belongs to one thread at a
 * time.  Ownership: each _new, _copy and _from_ returns an object the caller frees with its
 * _free; arguments are borrowed for the call, and what is kept of them is copied (literals,
 * options, byte strings, the program a matcher follows), except the vocabulary that a
 * matcher reads, which must outlive it. */
#ifndef ATLAS_CONSTRAINT_H
#define ATLAS_CONSTRAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_constraint atlas_constraint;
typedef struct atlas_constraint_vocab atlas_constraint_vocab;
typedef struct atlas_constraint_matcher atlas_constraint_matcher;
typedef struct atlas_tokenizer atlas_tokenizer; /* atlas/tokenizer.h */

enum {
    ATLAS_CONSTRAINT_MAX_DEPTH = 32,    /* nesting of objects and arrays in a JSON_OBJECT */
    ATLAS_CONSTRAINT_MAX_INDENT = 20,   /* spaces or tabs after a newline outside strings */
    ATLAS_CONSTRAINT_MAX_SEGMENTS = 4096, /* segments of one program */
    ATLAS_CONSTRAINT_MAX_OPTIONS = 1024,/* strings of one CHOICE */
    ATLAS_CONSTRAINT_MAX_BYTES = 65536, /* bytes of one LITERAL or CHOICE option */
};

/* ---- programs ------------------------------------------------------------------------- */

/* An empty program (complete at once).  Free with atlas_constraint_free. */
ATLAS_API atlas_status atlas_constraint_new(atlas_constraint **out);
ATLAS_API void atlas_constraint_free(atlas_constraint *c); /* NULL: no-op */

/* Appends a segment.  Errors: ATLAS_ERR_RANGE beyond the limits above, ATLAS_ERR_INVALID
 * for an ambiguous CHOICE or number (see above: checked when the next segment is added, and
 * by atlas_constraint_matcher_new for one that ends the program), ATLAS_ERR_NOMEM.
 * A failed append leaves the program as it was.  An empty literal adds nothing. */
ATLAS_API atlas_status atlas_constraint_add_literal(atlas_constraint *c, const char *text,
                                                    size_t len);
/* options[n] NUL-terminated strings, copied; duplicates count once; n >= 1. */
ATLAS_API atlas_status atlas_constraint_add_choice(atlas_constraint *c, const char *const *options,
                                                   int n);
ATLAS_API atlas_status atlas_constraint_add_json_object(atlas_constraint *c);

typedef enum atlas_constraint_json_kind {
    ATLAS_CONSTRAINT_JSON_OBJECT = 0, /* = atlas_constraint_add_json_object */
    ATLAS_CONSTRAINT_JSON_ANY,        /* any value: object, array, string, number, literal */
    ATLAS_CONSTRAINT_JSON_ARRAY,      /* any array */
    ATLAS_CONSTRAINT_JSON_STRING,
    ATLAS_CONSTRAINT_JSON_NUMBER,
    ATLAS_CONSTRAINT_JSON_INTEGER,    /* a number without fraction or exponent */
    ATLAS_CONSTRAINT_JSON_BOOLEAN,
    ATLAS_CONSTRAINT_JSON_ARRAY_OF_STRING, /* an array whose elements are all of one kind */
    ATLAS_CONSTRAINT_JSON_ARRAY_OF_NUMBER,
    ATLAS_CONSTRAINT_JSON_ARRAY_OF_INTEGER,
    ATLAS_CONSTRAINT_JSON_ARRAY_OF_BOOLEAN,
} atlas_constraint_json_kind;

/* Or'ed into a kind: null is allowed instead of the value. */
enum { ATLAS_CONSTRAINT_JSON_NULLABLE = 0x100 };

/* kind: an atlas_constraint_json_kind, possibly | ATLAS_CONSTRAINT_JSON_NULLABLE. */
ATLAS_API atlas_status atlas_constraint_add_json_value(atlas_constraint *c, int kind);

/* One of n alternatives (n in 1 .. ATLAS_CONSTRAINT_MAX_OPTIONS): keys[i], a non-empty
 * NUL-terminated string, then the program rest[i] (copied; rest or rest[i] NULL: nothing),
 * which has no free text and may end where it ends (see above).  The keys must be
 * prefix-free.  ATLAS_ERR_INVALID otherwise. */
ATLAS_API atlas_status atlas_constraint_add_alternatives(atlas_constraint *c,
                                                         const char *const *keys,
                                                         const atlas_constraint *const *rest,
                                                         int n);

/* Free text with n triggers, each followed by its program, as for alternatives.  Nothing
 * may be added after it (ATLAS_ERR_INVALID). */
ATLAS_API atlas_status atlas_constraint_add_free_text(atlas_constraint *c,
                                                      const char *const *triggers,
                                                      const atlas_constraint *const *rest,
                                                      int n);

/* A deep copy (the engine keeps one per request). */
ATLAS_API atlas_status atlas_constraint_copy(const atlas_constraint *c, atlas_constraint **out);

ATLAS_API int atlas_constraint_n_segments(const atlas_constraint *c);

/* ---- vocabularies --------------------------------------------------------------------- */

/* From explicit byte strings: token id i has bytes[i][0 .. lens[i]); lens[i] == 0 (or
 * bytes[i] NULL) means the token is never allowed.  The bytes are copied. */
ATLAS_API atlas_status atlas_constraint_vocab_new(const char *const *bytes, const size_t *lens,
                                                  int n, atlas_constraint_vocab **out);

/* From a tokenizer: ids 0 .. atlas_tokenizer_vocab_size(tok), each with
 * atlas_tokenizer_token_bytes (added tokens have their content, e.g. "<tool_call>").
 * skip_special: special tokens get no bytes (never allowed) — for a caller whose text drops
 * them, so that the text and the matched bytes stay the same. */
ATLAS_API atlas_status atlas_constraint_vocab_from_tokenizer(const atlas_tokenizer *tok,
                                                             bool skip_special,
                                                             atlas_constraint_vocab **out);
ATLAS_API void atlas_constraint_vocab_free(atlas_constraint_vocab *v); /* NULL: no-op */
ATLAS_API int atlas_constraint_vocab_size(const atlas_constraint_vocab *v);

/* ---- matchers ------------------------------------------------------------------------- */

/* A matcher at the start of c (copied: c may be freed after).  v must outlive the matcher.
 * v may be NULL for a matcher fed with atlas_constraint_matcher_accept_bytes only. */
ATLAS_API atlas_status atlas_constraint_matcher_new(const atlas_constraint *c,
                                                    const atlas_constraint_vocab *v,
                                                    atlas_constraint_matcher **out);
ATLAS_API void atlas_constraint_matcher_free(atlas_constraint_matcher *m); /* NULL: no-op */

/* Sets allowed[id] to 1 for every token whose bytes are all accepted from the current state
 * and 0 for the others, for id in [0, n); ids at or beyond the vocabulary's size are 0; in
 * free text, tokens without bytes too.  Returns the number allowed (0 when the program is complete: nothing may follow). */
ATLAS_API int atlas_constraint_matcher_allowed(atlas_constraint_matcher *m, uint8_t *allowed,
                                               int n);

/* Advances by token id.  ATLAS_ERR_INVALID (state unchanged) when the token is not allowed,
 * ATLAS_ERR_RANGE for an id outside the vocabulary. */
ATLAS_API atlas_status atlas_constraint_matcher_accept(atlas_constraint_matcher *m, int32_t id);

/* Advances by len bytes; ATLAS_ERR_INVALID (state unchanged) at the first byte refused,
 * naming its offset. */
ATLAS_API atlas_status atlas_constraint_matcher_accept_bytes(atlas_constraint_matcher *m,
                                                             const char *bytes, size_t len);

/* True once the program is complete (the last segment's last byte was accepted). */
ATLAS_API bool atlas_constraint_matcher_done(const atlas_constraint_matcher *m);

/* True when the text may end here: the program is complete, or the matcher is in free text
 * (not inside a triggered program).  Tokens without bytes are then allowed and accepted as
 * nothing; elsewhere they are never allowed. */
ATLAS_API bool atlas_constraint_matcher_can_end(const atlas_constraint_matcher *m);

#ifdef __cplusplus
}
#endif
#endif
