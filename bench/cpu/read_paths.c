/* bench/cpu/read_paths.c — how fast can a loader get a page-cached checkpoint into its own
 * buffers? Copies FILE in 64 MiB chunks, each split over THREADS threads, by one of:
 *   0  memcpy out of a plain mmap (one page fault per 4 KiB page)
 *   1  the same with MAP_POPULATE
 *   3  pread into the buffer (no mapping)
 *   5  madvise(MADV_POPULATE_READ) on each piece, then memcpy (the CUDA loader's old path)
 * Prints GB/s. Build: cc -O2 -pthread bench/cpu/read_paths.c -o /tmp/read_paths
 * Run on a file already in the page cache (cat FILE > /dev/null first). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { CHUNK = 64 << 20, MAX_THREADS = 64 };

typedef struct job {
    int fd, mode;
    const char *map;
    char *dst;
    size_t off, n;
} job;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *arg) {
    job *j = arg;
    if (j->mode == 3) {
        for (size_t d = 0; d < j->n;) {
            ssize_t r = pread(j->fd, j->dst + d, j->n - d, (off_t)(j->off + d));
            if (r <= 0) {
                perror("pread");
                exit(1);
            }
            d += (size_t)r;
        }
        return NULL;
    }
    if (j->mode == 5 && j->n) {
        uintptr_t a = (uintptr_t)(j->map + j->off) & ~(uintptr_t)4095;
        if (madvise((void *)a, (uintptr_t)(j->map + j->off + j->n) - a, 22 /* POPULATE_READ */))
            perror("madvise");
    }
    memcpy(j->dst, j->map + j->off, j->n);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: read_paths FILE MODE(0|1|3|5) THREADS\n");
        return 2;
    }
    int mode = atoi(argv[2]), T = atoi(argv[3]);
    if (T < 1 || T > MAX_THREADS) return 2;
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        perror(argv[1]);
        return 1;
    }
    size_t size = (size_t)st.st_size, per_max = CHUNK / T + 4096;
    char *buf[MAX_THREADS];
    for (int t = 0; t < T; t++) {
        buf[t] = aligned_alloc(4096, per_max);
        memset(buf[t], 1, per_max); /* the destination is warm, as a pinned pool is */
    }
    double t0 = now();
    const char *map = NULL;
    if (mode != 3) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | (mode == 1 ? MAP_POPULATE : 0), fd, 0);
        if (map == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
    }
    for (size_t off = 0; off < size; off += CHUNK) {
        size_t n = size - off < CHUNK ? size - off : CHUNK, per = (n + T - 1) / T;
        pthread_t th[MAX_THREADS];
        job j[MAX_THREADS];
        for (int t = 0; t < T; t++) {
            size_t a = t * per, b = a + per > n ? n : a + per;
            j[t] = (job){fd, mode, map, buf[t], off + a, b > a ? b - a : 0};
            pthread_create(&th[t], NULL, run, &j[t]);
        }
        for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    }
    printf("mode %d, %d threads: %.2f GB/s\n", mode, T, size / (now() - t0) / 1e9);
    return 0;
}
