/* core/file.c — see file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fault.h"
#include "core/memdir.h"

/* A file of a registered memory directory (atlas/memdir.h), read as fopen would. */
static atlas_status read_memory(const atlas_memdir_file *mf, const char *path, char **out,
                                size_t *len) {
    char *buf = malloc(mf->size + 1);
    if (!buf) return atlas_fail(ATLAS_ERR_NOMEM, "%s: cannot allocate %zu bytes", path,
                                mf->size + 1);
    if (mf->size) memcpy(buf, mf->data, mf->size);
    buf[mf->size] = '\0';
    *out = buf;
    if (len) *len = mf->size;
    return ATLAS_OK;
}

int atlas_file_open_regular(const char *path, struct stat *st) {
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer (a named pipe left
     * where a checkpoint's file should be hung a load, and with it the server's start) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        errno = EINVAL; /* the callers say "not a regular file" */
        return -2;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

atlas_status atlas_file_read(const char *path, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    if (ATLAS_FAULT_HERE())
        return atlas_fail(ATLAS_ERR_IO, "%s: cannot read: injected fault", path);
    bool inside;
    const atlas_memdir_file *mf = atlas_memdir_file_at(path, &inside);
    if (mf) return read_memory(mf, path, out, len);
    if (inside) return atlas_fail(ATLAS_ERR_IO, "%s: cannot open: no such file in memory", path);
    struct stat st;
    int fd = atlas_file_open_regular(path, &st);
    if (fd == -2) return atlas_fail(ATLAS_ERR_IO, "%s: not a regular file", path);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0) close(fd);
        return atlas_fail(ATLAS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return atlas_fail(ATLAS_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, size + 1);
    }
    size_t got = fread(buf, 1, size, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != size) {
        free(buf);
        return atlas_fail(ATLAS_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, size);
    }
    buf[size] = '\0';
    *out = buf;
    if (len) *len = size;
    return ATLAS_OK;
}

atlas_status atlas_file_map_open(const char *path, atlas_file_map *out) {
    out->data = NULL;
    out->size = 0;
    out->fd_open = false;
    if (ATLAS_FAULT_HERE())
        return atlas_fail(ATLAS_ERR_IO, "%s: cannot open: injected fault", path);
    bool inside;
    const atlas_memdir_file *mf = atlas_memdir_file_at(path, &inside);
    int fd = -1;
    if (inside && !mf)
        return atlas_fail(ATLAS_ERR_IO, "%s: cannot open: no such file in memory", path);
    struct stat st;
    if (mf) ATLAS_TRY(atlas_memdir_open_fd(mf, path, &fd));
    else fd = atlas_file_open_regular(path, &st);
    if (fd == -2) return atlas_fail(ATLAS_ERR_IO, "%s: not a regular file", path);
    if (fd < 0) return atlas_fail(ATLAS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (mf && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) { /* (the other: checked above) */
        close(fd);
        return atlas_fail(ATLAS_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        /* A shared read-only mapping: its pages are the page cache's own (no copy-on-write
         * bookkeeping), and nothing is ever written through it. */
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return atlas_fail(ATLAS_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    out->fd = fd;
    out->fd_open = true;
    return ATLAS_OK;
}

void atlas_file_map_close(atlas_file_map *map) {
    if (map && map->data) munmap((void *)map->data, map->size);
    if (map && map->fd_open) close(map->fd);
    if (map) {
        map->data = NULL;
        map->size = 0;
        map->fd_open = false;
    }
}

atlas_status atlas_file_read_at(int fd, void *dst, size_t n, uint64_t off) {
    char *p = dst;
    if (ATLAS_FAULT_HERE())
        return atlas_fail(ATLAS_ERR_IO, "fd %d: pread at %llu: injected fault", fd,
                          (unsigned long long)off);
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return atlas_fail(ATLAS_ERR_IO, "fd %d: pread at %llu: %s", fd,
                                     (unsigned long long)off, strerror(errno));
        if (r == 0) return atlas_fail(ATLAS_ERR_IO, "fd %d: end of file at %llu (%zu bytes "
                                      "short)", fd, (unsigned long long)off, n);
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return ATLAS_OK;
}

bool atlas_file_exists(const char *path) {
    size_t n;
    bool inside;
    if (atlas_memdir_file_at(path, &inside) || atlas_memdir_files(path, &n)) return true;
    if (inside) return false;
    struct stat st;
    /* a link whose target is gone (a Hugging Face cache's missing blob) or loops is there:
     * reading it fails and says so, where "absent" would drop an optional file's settings */
    return stat(path, &st) == 0 || lstat(path, &st) == 0;
}

atlas_status atlas_path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return atlas_fail(ATLAS_ERR_RANGE, "path too long: %s/%s", dir, name);
    return ATLAS_OK;
}

size_t atlas_mem_resident_sampled(const void *p, size_t n, size_t stride) {
    if (!p || !n) return 0;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096, in = 0;
    if (stride < page) stride = page;
    for (size_t o = 0; o < n; o += stride) {
        uintptr_t a = ((uintptr_t)p + o) & ~(uintptr_t)(page - 1);
        unsigned char v = 0;
        if (mincore((void *)a, page, &v) != 0) return 0;
        if (v & 1) in += n - o < stride ? n - o : stride;
    }
    return in;
}
