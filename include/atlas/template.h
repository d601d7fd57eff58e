/* atlas/template.h — a model's chat template (Jinja), rendered as transformers renders it.
 *
 * A template comes from a Hugging Face model directory: tokenizer_config.json's
 * "chat_template" (a string, or a list of {"name", "template"}), or chat_template.jinja,
 * plus "bos_token" / "eos_token" (a string or {"content": ...}). Rendering follows
 * transformers' apply_chat_template(tokenize=False): jinja2 with trim_blocks and
 * lstrip_blocks, its tojson (json.dumps with ", " / ": " separators, no ASCII escaping),
 * raise_exception() and strftime_now().
 *
 * A parsed template is immutable: render it from many threads at once. Errors (syntax,
 * unsupported construct, raise_exception, type errors while rendering) name the template
 * and the line:column, e.g. "chat_template:3:14: unknown filter 'foo'".
 *
 * A render is bounded so that a hostile template or request cannot hang or exhaust the
 * process: 5 million steps, 256 MiB of values, 64 nested macro calls, range() of at most a
 * million items; past a bound the render fails with a message. Integers are 64-bit (an
 * overflow is an error where Python would grow them); values nested deeper than 400 levels
 * print as "..." and compare unequal where Python would raise RecursionError.
 *
 * Threads: load and parse may be called from any thread; a template's render and getters
 * from any number of threads at once; atlas_template_free when no thread uses it anymore.
 * Ownership: load and parse return a template the caller frees (atlas_template_free);
 * render returns malloc'd text the caller free()s; the getters' strings are the
 * template's; arguments (the json_t values included) are borrowed for the call. */
#ifndef ATLAS_TEMPLATE_H
#define ATLAS_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_template atlas_template;
struct json_t; /* jansson's */

/* Loads DIR/chat_template.jinja or, when there is none, DIR/tokenizer_config.json's
 * chat_template (the file wins, as in transformers), with the config's bos_token and
 * eos_token. Named templates are all kept; render picks "tool_use" when tools are given and
 * it exists, else "default" (as transformers does). ATLAS_ERR_NOT_FOUND when the directory
 * has no template. Free with atlas_template_free. */
ATLAS_API atlas_status atlas_template_load(const char *dir, atlas_template **out);

/* An operator's replacement template for the model in dir: file is a Jinja file, a
 * tokenizer_config.json (any name ending in ".json": its chat_template), or a directory
 * holding either (as atlas_template_load reads one). The special tokens are still dir's
 * tokenizer_config.json's (dir NULL: none). Errors name the file, and for a template that
 * does not parse, its line:column (ATLAS_ERR_FORMAT); ATLAS_ERR_NOT_FOUND when file does
 * not exist or holds no template. Free with atlas_template_free. */
ATLAS_API atlas_status atlas_template_load_file(const char *dir, const char *file,
                                                atlas_template **out);

/* Parses one template from source. name is used in error messages (NULL: "template");
 * bos/eos may be NULL (then they render as ""). The strings are copied. */
ATLAS_API atlas_status atlas_template_parse(const char *source, const char *name,
                                            const char *bos_token, const char *eos_token,
                                            atlas_template **out);

ATLAS_API void atlas_template_free(atlas_template *tmpl); /* NULL is a no-op */

/* What to render. messages is the OpenAI "messages" array; tools the "tools" array or NULL;
 * kwargs an object of extra template variables (e.g. {"enable_thinking": false}) or NULL;
 * a kwarg may not take a name atlas_template_reserved gives (ATLAS_ERR_INVALID naming it).
 * Assistant tool_calls whose function.arguments is a JSON string holding an object are
 * rendered as that object (vLLM does this; templates such as Llama 3.1's call tojson on it).
 * The caller keeps ownership of the json_t values; they are not modified. */
typedef struct atlas_template_input {
    const struct json_t *messages;
    const struct json_t *tools;
    const struct json_t *kwargs;
    bool add_generation_prompt;
} atlas_template_input;

/* Whether name is set by the renderer or is a builtin function, which a keyword argument
 * may not replace: messages, tools, documents, add_generation_prompt, bos_token, eos_token,
 * unk_token, pad_token, and every builtin of the template engine (range, namespace, dict,
 * raise_exception, strftime_now, ...). */
ATLAS_API bool atlas_template_reserved(const char *name);

/* Renders into *out (malloc'd, NUL-terminated; the caller frees it with free()).
 * ATLAS_ERR_INVALID for bad input (messages not an array), ATLAS_ERR_FORMAT for errors
 * while rendering (raise_exception, type errors), with line:column. */
ATLAS_API atlas_status atlas_template_render(const atlas_template *tmpl,
                                             const atlas_template_input *in, char **out);

/* As atlas_template_render, and where the text's pieces meet: *cuts (malloc'd, NULL when
 * *n_cuts is 0; the caller frees it) holds the byte offsets, ascending and inside the text,
 * at which one printed piece ends and the next begins. A piece is a text block of the
 * template or the value of one {{ }} (a macro's or a set block's output printed whole keeps
 * its own pieces). atlas_shield_encode_pieces takes them so that a special token spelt
 * across a client's string and what the template prints beside it stays text. */
ATLAS_API atlas_status atlas_template_render_pieces(const atlas_template *tmpl,
                                                    const atlas_template_input *in, char **out,
                                                    size_t **cuts, size_t *n_cuts);

/* As atlas_template_render, from JSON text: messages_json is required, tools_json /
 * kwargs_json may be NULL. JSON syntax errors name the argument and line:column. */
ATLAS_API atlas_status atlas_template_render_str(const atlas_template *tmpl,
                                                 const char *messages_json, const char *tools_json,
                                                 bool add_generation_prompt,
                                                 const char *kwargs_json, char **out);

/* The source text of the default template (for choosing a tool-call format), and the
 * special tokens; valid while tmpl lives. Tokens are "" when absent. */
ATLAS_API const char *atlas_template_source(const atlas_template *tmpl);
ATLAS_API const char *atlas_template_bos(const atlas_template *tmpl);
ATLAS_API const char *atlas_template_eos(const atlas_template *tmpl);

#ifdef __cplusplus
}
#endif
#endif
