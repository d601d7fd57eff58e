/* core/fault.c — see fault.h. */
#include "core/fault.h"

/* The wrappers below call the C library's allocators, not themselves. */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup
#undef aligned_alloc

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATLAS_FAULT

static atomic_long fault_hits;
static atomic_long fault_target; /* the hit to fail; 0: none */
static atomic_int fault_fired;
static char fault_site[256];     /* written once per arming, by the thread that fired */
static atlas_fault_site *_Atomic fault_trace_buf;
static atomic_long fault_trace_cap;

int atlas_fault_available(void) { return 1; }

int atlas_fault_arm(long n) {
    atomic_store(&fault_target, 0);
    atomic_store(&fault_fired, 0);
    fault_site[0] = '\0';
    atomic_store(&fault_hits, 0);
    atomic_store(&fault_target, n > 0 ? n : 0);
    return 1;
}

void atlas_fault_trace(atlas_fault_site *buf, long cap) {
    atomic_store(&fault_trace_buf, NULL);
    atomic_store(&fault_trace_cap, buf && cap > 0 ? cap : 0);
    atomic_store(&fault_trace_buf, buf);
}

long atlas_fault_hits(void) { return atomic_load(&fault_hits); }

int atlas_fault_fired(char *site, size_t cap) {
    int fired = atomic_load(&fault_fired);
    if (site && cap) snprintf(site, cap, "%s", fired ? fault_site : "");
    return fired;
}

bool atlas_fault_point(const char *file, int line) {
    long hit = atomic_fetch_add(&fault_hits, 1) + 1;
    atlas_fault_site *trace = atomic_load(&fault_trace_buf);
    if (trace && hit <= atomic_load(&fault_trace_cap)) /* each hit its own slot */
        trace[hit - 1] = (atlas_fault_site){file, line};
    long target = atomic_load(&fault_target);
    /* Once: only the thread that swaps the target back to 0 fails. */
    if (target <= 0 || hit != target ||
        !atomic_compare_exchange_strong(&fault_target, &target, 0))
        return false;
    const char *base = strrchr(file, '/');
    snprintf(fault_site, sizeof fault_site, "%s:%d", base ? base + 1 : file, line);
    atomic_store(&fault_fired, 1);
    return true;
}

#else

int atlas_fault_available(void) { return 0; }
int atlas_fault_arm(long n) { (void)n; return 0; }
long atlas_fault_hits(void) { return 0; }
void atlas_fault_trace(atlas_fault_site *buf, long cap) { (void)buf, (void)cap; }
int atlas_fault_fired(char *site, size_t cap) {
    if (site && cap) site[0] = '\0';
    return 0;
}
bool atlas_fault_point(const char *file, int line) {
    (void)file, (void)line;
    return false;
}

#endif

/* A failed allocation as the C library reports one. */
static bool alloc_fails(const char *file, int line) {
    if (!atlas_fault_point(file, line)) return false;
    errno = ENOMEM;
    return true;
}

void *atlas_fault_malloc(size_t n, const char *file, int line) {
    return alloc_fails(file, line) ? NULL : malloc(n);
}

void *atlas_fault_calloc(size_t count, size_t size, const char *file, int line) {
    return alloc_fails(file, line) ? NULL : calloc(count, size);
}

/* Like realloc's own failure, leaves p allocated and unchanged. */
void *atlas_fault_realloc(void *p, size_t n, const char *file, int line) {
    return alloc_fails(file, line) ? NULL : realloc(p, n);
}

char *atlas_fault_strdup(const char *s, const char *file, int line) {
    return alloc_fails(file, line) ? NULL : strdup(s);
}

char *atlas_fault_strndup(const char *s, size_t n, const char *file, int line) {
    return alloc_fails(file, line) ? NULL : strndup(s, n);
}

void *atlas_fault_aligned_alloc(size_t align, size_t n, const char *file, int line) {
    return alloc_fails(file, line) ? NULL : aligned_alloc(align, n);
}
