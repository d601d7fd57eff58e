/* server/listen.h — the listening socket, made before anything else so that a port in use or
 * a host that does not resolve fails the start at once, not after a model has loaded.
 * Internal to src/server.
 *
 * The host is resolved with getaddrinfo, as curl and llama-server do: a numeric IPv4 or IPv6
 * address, or a name ("localhost", a name of this machine).  Its addresses are tried IPv4
 * ones first (what clients of "localhost" try first, and where 127.0.0.1 URLs go), each in
 * getaddrinfo's order, and the first that binds is kept. */
#ifndef ATLAS_SERVER_LISTEN_H
#define ATLAS_SERVER_LISTEN_H

#include <stdbool.h>

#include "atlas/status.h"

typedef struct atlas_listen {
    int fd;         /* listening (backlog SOMAXCONN), close-on-exec; -1: none */
    int port;       /* the bound port (the one the system chose for port 0) */
    bool v6;
    bool loopback;  /* bound to 127.0.0.0/8 or ::1 */
    char addr[64];  /* the bound address, numeric ("127.0.0.1", "::1") */
} atlas_listen;

/* Binds and listens.  ATLAS_ERR_INVALID for a host that does not resolve, ATLAS_ERR_RANGE
 * for a port outside 0..65535, ATLAS_ERR_IO when no address binds (the first failure's
 * reason, e.g. "Address already in use"); out->fd is -1 then. */
atlas_status atlas_listen_open(const char *host, int port, atlas_listen *out);

/* Closes the socket (fd -1: nothing). */
void atlas_listen_close(atlas_listen *l);

#endif
