/* server/listen.c — see listen.h. */
#include "server/listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "atlas/status.h"

/* One address: socket, SO_REUSEADDR (a restart binds while old connections linger in
 * TIME_WAIT), IPv6 only for an IPv6 address (as libmicrohttpd made it), bind, listen.
 * Returns the descriptor, or -1 with errno set. */
static int bind_one(const struct addrinfo *ai) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return -1;
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

static void describe(const struct sockaddr *sa, char *buf, size_t cap) {
    const void *a = sa->sa_family == AF_INET6
                        ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                        : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
    if (!inet_ntop(sa->sa_family, a, buf, (socklen_t)cap)) snprintf(buf, cap, "?");
}

/* The bound address and port, read back from the socket. */
static atlas_status bound(atlas_listen *out) {
    struct sockaddr_storage ss;
    socklen_t n = sizeof ss;
    if (getsockname(out->fd, (struct sockaddr *)&ss, &n) != 0)
        return atlas_fail(ATLAS_ERR_IO, "getsockname on the listening socket: %s",
                          strerror(errno));
    describe((struct sockaddr *)&ss, out->addr, sizeof out->addr);
    out->v6 = ss.ss_family == AF_INET6;
    if (out->v6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)&ss;
        out->port = ntohs(a6->sin6_port);
        out->loopback = IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr);
    } else {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)&ss;
        out->port = ntohs(a4->sin_port);
        out->loopback = (ntohl(a4->sin_addr.s_addr) >> 24) == 127;
    }
    return ATLAS_OK;
}

atlas_status atlas_listen_open(const char *host, int port, atlas_listen *out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (port < 0 || port > 65535) return atlas_fail(ATLAS_ERR_RANGE, "port %d: not in 0..65535", port);
    if (!host || !*host) return atlas_fail(ATLAS_ERR_INVALID, "host: empty");
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0)
        return atlas_fail(ATLAS_ERR_INVALID, "host '%s': cannot resolve it: %s", host,
                          g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    int first_err = 0;
    char first_addr[64] = "";
    for (int pass = 0; pass < 2 && out->fd < 0; pass++) /* IPv4 addresses, then the others */
        for (const struct addrinfo *ai = res; ai && out->fd < 0; ai = ai->ai_next) {
            if ((ai->ai_family == AF_INET) != (pass == 0)) continue;
            out->fd = bind_one(ai);
            if (out->fd < 0 && !first_err) {
                first_err = errno;
                describe(ai->ai_addr, first_addr, sizeof first_addr);
            }
        }
    freeaddrinfo(res);
    if (out->fd < 0) {
        bool v6 = strchr(first_addr, ':') != NULL;
        return atlas_fail(ATLAS_ERR_IO, "listening on %s port %d failed: binding %s%s%s:%d: %s%s",
                          host, port, v6 ? "[" : "", first_addr, v6 ? "]" : "", port,
                          strerror(first_err ? first_err : EADDRNOTAVAIL),
                          first_err == EADDRINUSE ? " (another program listens there: pick "
                                                    "another --port)" : "");
    }
    atlas_status st = bound(out);
    if (st != ATLAS_OK) atlas_listen_close(out);
    return st;
}

void atlas_listen_close(atlas_listen *l) {
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
}
