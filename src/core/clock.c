/* core/clock.c — see clock.h. */
#include "core/clock.h"

#include <time.h>

double atlas_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
