/* bench/cpu/cpu_time.h — what the hand-built CPU kernel benchmarks share: the calling
 * thread's CPU time (the steady figure on a shared machine, where wall times swing) and a
 * qsort comparison of doubles for their medians. */
#ifndef ATLAS_BENCH_CPU_TIME_H
#define ATLAS_BENCH_CPU_TIME_H

#include <time.h>

static inline double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static inline int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
