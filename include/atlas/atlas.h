/* atlas/atlas.h — the whole public API in one include, for embedders:
 *
 *     #include <atlas/atlas.h>        link with -latlas (libatlas.so.ATLAS_API_VERSION)
 *
 * examples/embed.c is a complete program: an engine on a model directory, a prompt, the
 * streamed text.  What each header holds:
 *   version.h     the release, ATLAS_API_VERSION (the soname), atlas_version()
 *   status.h      atlas_status (stable codes), atlas_last_error() — the message is per thread
 *   host.h        the process's GPU
 *   model.h       loading a model directory; counted handles
 *   memdir.h      a model directory held in memory (a model shipped inside a program)
 *   utf8.h        others' bytes made valid UTF-8 for a log, JSON or a terminal
 *   tokenizer.h   tokenizer.json: encode, decode, streaming decode
 *   template.h    chat templates (Jinja), rendered as transformers does
 *   toolcall.h    tool calls found in generated text
 *   reasoning.h   a thinking model's <think> block split from the reply
 *   shield.h      control tokens only from the chat template, never from client text
 *   sampler.h     logits to a token id
 *   constraint.h  constrained decoding (JSON, choices, literals)
 *   engine.h      requests in, a stream of token events out, over several models
 *   parallel.h    tensor parallelism's preflight
 *   server.h      the OpenAI-compatible HTTP server over an engine
 *
 * Conventions, which every header follows and states for its own functions:
 *   - Ownership: an object that _create/_load/_new/_start returns is the caller's until the
 *     matching _free/_release/_stop (NULL: a no-op); pointers passed in are borrowed for the
 *     call unless the function says it copies or keeps them; a pointer returned is the
 *     object's (valid while it lives) unless the function says "malloc'd" (the caller
 *     free()s it).
 *   - Threads: each header says which of its functions may be called from any thread and
 *     which belong to one thread at a time.
 *   - Errors: a function that can fail returns atlas_status and leaves a message for
 *     atlas_last_error() on the calling thread. */
#ifndef ATLAS_ATLAS_H
#define ATLAS_ATLAS_H

#include "atlas/version.h"
#include "atlas/status.h"
#include "atlas/host.h"
#include "atlas/model.h"
#include "atlas/memdir.h"
#include "atlas/utf8.h"
#include "atlas/tokenizer.h"
#include "atlas/template.h"
#include "atlas/toolcall.h"
#include "atlas/reasoning.h"
#include "atlas/shield.h"
#include "atlas/sampler.h"
#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/parallel.h"
#include "atlas/server.h"

#endif
