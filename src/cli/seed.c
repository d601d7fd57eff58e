/* cli/seed.c — the seed `atlas run` and `atlas chat` sample with when none is given. */
#include <stdint.h>
#include <sys/random.h>
#include <time.h>

#include "cli/cli.h"

/* 53 bits: a seed that --json prints must read back exactly as a JSON number (a double). */
#define SEED_MASK ((UINT64_C(1) << 53) - 1)

uint64_t atlas_cli_random_seed(void) {
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) == (ssize_t)sizeof s) return s & SEED_MASK;
    struct timespec ts; /* no random source (an old kernel, a sandbox): the clock differs too */
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007u + (uint64_t)ts.tv_nsec) & SEED_MASK;
}
