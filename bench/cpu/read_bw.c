/* bench/cpu/read_bw.c — the memory read ceiling for CPU decode: THREADS threads each sum
 * their share of a GIB-GiB buffer with 8-lane loads (4 accumulators), best and median of 5
 * passes, in GB/s. A decode step reads every weight once, so its rate is at most this.
 *   cc -O2 -march=x86-64-v3 -pthread bench/cpu/read_bw.c -o read_bw && ./read_bw 2 1 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct part { const float *p; size_t n; float sum; } part;

static void *reader(void *arg) {
    part *a = arg;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= a->n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(a->p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(a->p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(a->p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(a->p + i + 24));
    }
    float f[8];
    _mm256_storeu_ps(f, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    a->sum = f[0] + f[7];
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2;
    double gib = argc > 2 ? atof(argv[2]) : 1.0;
    size_t n = (size_t)(gib * (1 << 30)) / sizeof(float) / 32 / nt * 32 * nt;
    float *buf = aligned_alloc(64, n * sizeof(float));
    if (nt < 1 || nt > 64 || !buf) return 1;
    memset(buf, 0, n * sizeof(float));
    double gbps[5];
    float total = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        part pa[64];
        double t0 = now();
        for (int i = 0; i < nt; i++) {
            pa[i] = (part){buf + n / nt * i, n / nt, 0};
            pthread_create(&th[i], NULL, reader, &pa[i]);
        }
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL), total += pa[i].sum;
        gbps[rep] = n * sizeof(float) / (now() - t0) / 1e9;
    }
    qsort(gbps, 5, sizeof(double), cmp);
    printf("read %d thread(s), %.2f GiB: best %.1f GB/s, median %.1f GB/s (sum %g)\n", nt,
           n * sizeof(float) / (double)(1 << 30), gbps[4], gbps[2], total);
    return 0;
}
