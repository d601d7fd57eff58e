/* core/clock.h — the monotonic clock every timing in the library reads.  Internal. */
#ifndef ATLAS_CORE_CLOCK_H
#define ATLAS_CORE_CLOCK_H

/* Milliseconds since an arbitrary point (CLOCK_MONOTONIC): only differences mean anything. */
double atlas_now_ms(void);

#endif
