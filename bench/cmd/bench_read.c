/* bench/cmd/bench_read.c — the page-cache read probe for CPU loads (bench_internal.h). */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_internal.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/file.h"
#include "format/safetensors.h"

/* READ_RING pieces (512 MiB) in all, shared out among the threads: written in turn, more than
 * a CPU's caches hold, so that the copies land in memory as a load's do */
enum { READ_PIECE = 4 << 20, READ_RING = 128, READ_FILES = 64, READ_THREADS = 64 };

typedef struct read_probe {
    int fds[READ_FILES];
    uint64_t sizes[READ_FILES];
    int n_files;
    uint64_t pieces; /* over all files, READ_PIECE each (a file's last one shorter) */
    atomic_uint_least64_t next;
    atomic_int failed;
    char *bufs[READ_THREADS]; /* ring pieces each */
    unsigned ring;
} read_probe;

typedef struct read_thread {
    read_probe *p;
    int t;
} read_thread;

/* Takes pieces in turn, as the CPU backend's readers do, into its own (warm) buffer. */
static void *read_main(void *arg) {
    read_thread *rt = arg;
    read_probe *p = rt->p;
    for (unsigned j = 0;; j++) {
        uint64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->pieces || atomic_load(&p->failed)) return NULL;
        int f = 0;
        uint64_t first = 0, in_file;
        while (f < p->n_files &&
               i >= first + (in_file = (p->sizes[f] + READ_PIECE - 1) / READ_PIECE)) {
            first += in_file;
            f++;
        }
        uint64_t off = (i - first) * READ_PIECE;
        size_t n = p->sizes[f] - off < READ_PIECE ? (size_t)(p->sizes[f] - off) : READ_PIECE;
        if (atlas_file_read_at(p->fds[f], p->bufs[rt->t] + (size_t)(j % p->ring) * READ_PIECE, n,
                               off) != ATLAS_OK)
            atomic_store(&p->failed, 1);
    }
}

/* One timed pass over the files with `threads` threads. */
static atlas_status read_pass(read_probe *p, int threads, double *seconds) {
    atomic_store(&p->next, 0);
    pthread_t th[READ_THREADS];
    read_thread rt[READ_THREADS];
    int started = 0;
    double t0 = atlas_now_ms();
    for (int t = 1; t < threads; t++, started++) {
        rt[t] = (read_thread){p, t};
        if (pthread_create(&th[t], NULL, read_main, &rt[t]) != 0) break;
    }
    rt[0] = (read_thread){p, 0};
    read_main(&rt[0]);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    *seconds = (atlas_now_ms() - t0) / 1e3;
    if (started != threads - 1) return atlas_fail(ATLAS_ERR_IO, "read probe: starting threads");
    if (atomic_load(&p->failed)) return atlas_fail(ATLAS_ERR_IO, "read probe: %s",
                                                   atlas_last_error());
    return ATLAS_OK;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static atlas_status probe_files(read_probe *p, const char *dir, atlas_bench_read *out) {
    atlas_st *st = NULL;
    ATLAS_TRY(atlas_st_open_dir(dir, &st));
    atlas_status s = ATLAS_OK;
    const char *last = NULL;
    for (size_t i = 0; i < atlas_st_count(st) && s == ATLAS_OK; i++) { /* shard by shard */
        const char *f = atlas_st_at(st, i)->file;
        if (last && !strcmp(last, f)) continue;
        last = f;
        int fd = p->n_files < READ_FILES ? open(f, O_RDONLY | O_CLOEXEC) : -1;
        off_t end = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
        if (fd < 0 || end < 0) {
            s = atlas_fail(ATLAS_ERR_IO, "read probe: %s: cannot open it (or more than %d "
                           "files)", f, READ_FILES);
            if (fd >= 0) close(fd);
            break;
        }
        p->fds[p->n_files] = fd;
        p->sizes[p->n_files++] = (uint64_t)end;
        p->pieces += ((uint64_t)end + READ_PIECE - 1) / READ_PIECE;
        out->bytes += (size_t)end;
    }
    atlas_st_free(st);
    out->files = p->n_files;
    return s;
}

atlas_status atlas_bench_read_measure(const char *dir, int threads, int passes,
                                      atlas_bench_read *out) {
    memset(out, 0, sizeof *out);
    if (threads < 1 || threads > READ_THREADS || passes < 1 || passes > 16)
        return atlas_fail(ATLAS_ERR_INVALID, "read probe: %d threads (1..%d), %d passes (1..16)",
                          threads, READ_THREADS, passes);
    read_probe *p = calloc(1, sizeof *p);
    if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "read probe: out of memory");
    atlas_status s = probe_files(p, dir, out);
    /* in huge pages, as the CPU backend's weights are: into one warm 4 MiB buffer of 4 KiB
     * pages a thread the probe read at about half the rate the loads did on the dev VM;
     * written before the clock */
    p->ring = READ_RING / threads > 2 ? READ_RING / threads : 2;
    size_t ring_bytes = (size_t)p->ring * READ_PIECE;
    for (int t = 0; t < threads && s == ATLAS_OK; t++) {
        void *b = NULL;
        if (posix_memalign(&b, 2 << 20, ring_bytes)) b = NULL;
        p->bufs[t] = b;
        if (!b) {
            s = atlas_fail(ATLAS_ERR_NOMEM, "read probe: out of memory");
            break;
        }
#ifdef MADV_HUGEPAGE
        (void)madvise(b, ring_bytes, MADV_HUGEPAGE);
#endif
        memset(b, 1, ring_bytes);
    }
    double sec[16];
    for (int i = 0; i < passes && s == ATLAS_OK; i++) s = read_pass(p, threads, &sec[i]);
    if (s == ATLAS_OK) {
        qsort(sec, (size_t)passes, sizeof *sec, cmp_d);
        out->seconds = sec[passes / 2];
        out->gbps = out->seconds > 0 ? out->bytes / 1e9 / out->seconds : 0;
        out->threads = threads;
        out->piece_bytes = READ_PIECE;
    }
    for (int t = 0; t < threads; t++) free(p->bufs[t]);
    for (int f = 0; f < p->n_files; f++) close(p->fds[f]);
    free(p);
    return s;
}
