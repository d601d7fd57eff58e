/* format/layout.h — whether a path given as a model directory is one that atlas reads (a
 * Hugging Face directory: config.json and safetensors weights), and when it is not, what it
 * is instead: a GGUF file, PyTorch .bin weights, a Hugging Face cache entry, a hub id that
 * was never downloaded.  The message says so and how to get what atlas reads, so that the
 * first mistake a user makes is answered with the way out.  Internal (atlas/model.h has
 * the public atlas_model_check_layout). */
#ifndef ATLAS_FORMAT_LAYOUT_H
#define ATLAS_FORMAT_LAYOUT_H

#include "atlas/status.h"

/* ATLAS_OK when dir holds config.json and model.safetensors or model.safetensors.index.json
 * (what the loader needs before it reads a byte of them); otherwise a failure whose message
 * names the path and what to do:
 *   ATLAS_ERR_UNSUPPORTED  a model in a form atlas does not read (GGUF, .bin or .pth
 *                          weights, a Hugging Face cache entry, a directory of models)
 *   ATLAS_ERR_IO           no model there: no such path (with the download command when the
 *                          name looks like a hub id), a file, no config.json
 *   ATLAS_ERR_NOT_FOUND    config.json without the safetensors weights
 * (the last two as the loader failed before this check was made).
 * Reads directory entries and at most a file's first bytes; any thread. */
atlas_status atlas_layout_check(const char *dir);

#endif
