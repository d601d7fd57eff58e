/* cli/chat_http.h — the small HTTP/1.1 client `atlas chat --url` talks to a running `atlas
 * serve` (or any OpenAI-compatible server) with: plain HTTP on a POSIX socket, chunked or
 * length-delimited bodies, and the server-sent events of a streamed chat completion. One
 * request a connection (Connection: close), so no state is kept between turns but the URL. */
#ifndef ATLAS_CLI_CHAT_HTTP_H
#define ATLAS_CLI_CHAT_HTTP_H

#include <signal.h>
#include <stddef.h>

typedef struct chat_http chat_http;

/* Parses URL ("http://HOST[:PORT][/PREFIX]", where PREFIX may end in /v1) and keeps the API
 * key (NULL: none). 0 on success, else 1 with err saying what is wrong. *out is the
 * caller's (chat_http_free). */
int chat_http_create(const char *url, const char *api_key, chat_http **out, char *err,
                     size_t errcap);
void chat_http_free(chat_http *h); /* NULL: no-op */

/* Called with each piece of the answer as it streams: reasoning 1 for a thinking model's
 * delta.reasoning_content, 0 for delta.content. */
typedef void (*chat_http_text_fn)(void *user, int reasoning, const char *text, size_t len);

/* POSTs body (a chat completion request with "stream": true) to PREFIX/v1/chat/completions
 * and calls fn for each delta until "data: [DONE]". *cancel is polled while waiting: once
 * non-zero the connection is closed, which the server takes as the client gone and cancels
 * the generation. Returns 0 when the answer ended, 2 when cancelled, 1 on an error (err:
 * the server's message with its status, or what failed on the socket). */
int chat_http_stream(chat_http *h, const char *body, chat_http_text_fn fn, void *user,
                     volatile sig_atomic_t *cancel, char *err, size_t errcap);

/* POSTs body (a /tokenize request with "messages", as vLLM and atlas take it) to
 * PREFIX/tokenize: *count, the tokens of the conversation as the chat template renders it,
 * and *ctx, the model's context ("max_model_len"). 0, or 1 when the server cannot say (an
 * error, no such route: err says what). */
int chat_http_count(chat_http *h, const char *body, int *count, int *ctx, char *err,
                    size_t errcap);

/* GETs PREFIX/v1/models and returns the id of the first model listed in *name (malloc'd,
 * the caller frees it): what chat talks to when --model is not given. 0 or 1 as above. */
int chat_http_first_model(chat_http *h, char **name, char *err, size_t errcap);

#endif
