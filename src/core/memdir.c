/* core/memdir.c — see atlas/memdir.h: a process-wide list of in-memory directories, which
 * core/file.c consults before the file system. */
#include "core/memdir.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

typedef struct memdir {
    struct memdir *next;
    char *dir;
    size_t dir_len;
    atlas_memdir_file *files; /* names copied; bytes borrowed */
    size_t n;
} memdir;

/* Loaders are given a path and nothing else, so the registry has to be process-wide. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static memdir *head;

static memdir *find_dir(const char *dir, size_t len) {
    for (memdir *d = head; d; d = d->next)
        if (d->dir_len == len && !memcmp(d->dir, dir, len)) return d;
    return NULL;
}

static void memdir_free(memdir *d) {
    if (!d) return;
    for (size_t i = 0; d->files && i < d->n; i++) free((char *)d->files[i].name);
    free(d->files);
    free(d->dir);
    free(d);
}

static atlas_status check_args(const char *dir, const atlas_memdir_file *files, size_t n) {
    size_t len = dir ? strlen(dir) : 0;
    if (len == 0 || dir[len - 1] == '/')
        return atlas_fail(ATLAS_ERR_INVALID, "memdir: directory '%s': empty or ending in '/'",
                          dir ? dir : "(null)");
    if (n > 0 && !files)
        return atlas_fail(ATLAS_ERR_INVALID, "memdir %s: %zu files but no table", dir, n);
    for (size_t i = 0; i < n; i++) {
        const char *name = files[i].name;
        if (!name || !*name || strchr(name, '/') || (files[i].size && !files[i].data))
            return atlas_fail(ATLAS_ERR_INVALID, "memdir %s: file %zu: a name without '/' "
                              "and its bytes are needed", dir, i);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(files[j].name, name))
                return atlas_fail(ATLAS_ERR_INVALID, "memdir %s: file '%s' given twice", dir,
                                  name);
    }
    return ATLAS_OK;
}

atlas_status atlas_memdir_add(const char *dir, const atlas_memdir_file *files, size_t n) {
    ATLAS_TRY(check_args(dir, files, n));
    memdir *d = calloc(1, sizeof *d);
    if (d) d->dir = strdup(dir), d->dir_len = strlen(dir);
    if (d && n) d->files = calloc(n, sizeof *d->files);
    bool ok = d && d->dir && (n == 0 || d->files);
    for (size_t i = 0; ok && i < n; i++) {
        d->files[i] = files[i];
        d->files[i].name = strdup(files[i].name);
        ok = d->files[i].name != NULL;
        d->n = i + 1;
    }
    if (!ok) {
        memdir_free(d);
        return atlas_fail(ATLAS_ERR_NOMEM, "memdir %s: out of memory", dir);
    }
    pthread_mutex_lock(&mu);
    bool dup = find_dir(dir, d->dir_len) != NULL;
    if (!dup) d->next = head, head = d;
    pthread_mutex_unlock(&mu);
    if (dup) {
        memdir_free(d);
        return atlas_fail(ATLAS_ERR_INVALID, "memdir %s: already registered", dir);
    }
    return ATLAS_OK;
}

const atlas_memdir_file *atlas_memdir_file_at(const char *path, bool *inside) {
    if (inside) *inside = false;
    const char *slash = strrchr(path, '/');
    if (!slash) return NULL;
    const atlas_memdir_file *found = NULL;
    pthread_mutex_lock(&mu);
    memdir *d = find_dir(path, (size_t)(slash - path));
    for (size_t i = 0; d && !found && i < d->n; i++)
        if (!strcmp(d->files[i].name, slash + 1)) found = &d->files[i];
    pthread_mutex_unlock(&mu);
    if (inside) *inside = d != NULL;
    return found;
}

const atlas_memdir_file *atlas_memdir_files(const char *dir, size_t *n) {
    pthread_mutex_lock(&mu);
    memdir *d = find_dir(dir, strlen(dir));
    pthread_mutex_unlock(&mu);
    *n = d ? d->n : 0;
    return d ? d->files : NULL;
}

atlas_status atlas_memdir_open_fd(const atlas_memdir_file *f, const char *path, int *fd) {
    *fd = -1;
    int m = memfd_create(f->name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m < 0) return atlas_fail(ATLAS_ERR_IO, "%s: memfd_create: %s", path, strerror(errno));
    const char *p = f->data;
    size_t left = f->size;
    while (left > 0) {
        ssize_t w = write(m, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(m);
            return atlas_fail(e == ENOSPC || e == ENOMEM ? ATLAS_ERR_NOMEM : ATLAS_ERR_IO,
                              "%s: writing its memfd: %s", path, strerror(e));
        }
        p += w, left -= (size_t)w;
    }
    /* F_SEAL_FUTURE_WRITE, not F_SEAL_WRITE: the latter fails with EBUSY while a page just
     * written still holds a reference in another CPU's LRU batch, and no writable mapping of
     * this memfd exists for the former to leave behind. */
    if (fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) !=
        0) {
        int e = errno;
        close(m);
        return atlas_fail(ATLAS_ERR_IO, "%s: sealing its memfd: %s", path, strerror(e));
    }
    *fd = m;
    return ATLAS_OK;
}
