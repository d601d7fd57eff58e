/* tests/http_once.c — see http_once.h. */
#include "http_once.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int http_dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

char *http_once(int port, const char *method, const char *path, const char *body, int *status) {
    int fd = http_dial(port);
    *status = 0;
    if (fd < 0) return NULL;
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, blen);
    if (write(fd, head, (size_t)n) != n || (blen && write(fd, body, blen) != (ssize_t)blen)) {
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) {
            char *more = realloc(buf, cap * 2);
            if (!more) break;
            buf = more;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0) break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    sscanf(buf, "HTTP/1.1 %d", status);
    return buf;
}
