/* tests/http_once.h — one HTTP/1.1 exchange with a server on a loopback port, written by hand
 * over a real socket: the C tests' client of atlas's server library. */
#ifndef ATLAS_TEST_HTTP_ONCE_H
#define ATLAS_TEST_HTTP_ONCE_H

/* A connected socket to 127.0.0.1:port, -1 when the connect fails. */
int http_dial(int port);

/* Sends method path (body: JSON or NULL) with "Connection: close" and reads the whole answer
 * (malloc'd, the caller frees; NULL when the connection failed); *status its HTTP status, 0
 * when none came. */
char *http_once(int port, const char *method, const char *path, const char *body, int *status);

#endif
