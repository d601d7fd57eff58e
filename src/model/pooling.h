/* model/pooling.h — whether a model directory is an embedding model, as
 * sentence-transformers lays one out: modules.json lists a Transformer, a Pooling module
 * (its config in e.g. 1_Pooling/config.json) and optionally a Normalize one.  Internal.
 *
 * Pooling modes read: mean, last token, cls (exactly one, include_prompt true); a module
 * or mode atlas does not compute (Dense, max, weighted mean, ...) is refused by name, since
 * leaving it out would give other vectors without a word. */
#ifndef ATLAS_MODEL_POOLING_H
#define ATLAS_MODEL_POOLING_H

#include "atlas/status.h"
#include "model/config.h"

/* Sets cfg->pooling and cfg->normalize from DIR/modules.json (absent: a generative model,
 * ATLAS_POOL_NONE; but a Qwen3Model, which has no head, is then refused).  Errors name the
 * file and field. */
atlas_status atlas_pooling_load(const char *dir, atlas_config *cfg);

/* "mean", "last", "cls", "none". */
const char *atlas_pooling_name(atlas_pooling p);

#endif
