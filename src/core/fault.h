/* core/fault.h — fault injection, SQLite's way: counting the failure sites.  Internal.
 *
 * In a build configured with -DATLAS_FAULT=ON (the library's sources compiled with
 * ATLAS_FAULT defined) every allocation of library code (malloc, calloc, realloc, strdup,
 * strndup, aligned_alloc: core/fault_alloc.h redirects them), every file read (core/file.c),
 * every device allocation (the CUDA registry's cuMemAlloc, the host's and stage.c's pinned
 * memory) and every kernel launch of backend/cuda/ops_cuda.c (launch, launch_cluster; not
 * the replay of a captured graph, nor cuBLASLt's own launches) is a site. Allocations by
 * other libraries (jansson, PCRE2) are not. Each time the code reaches a site it counts one
 * hit; atlas_fault_arm(n) makes the n-th hit from then on fail, once: an allocation returns
 * NULL with errno ENOMEM, a read or device call its error status, before anything is asked of
 * the system or the driver (so a failure never poisons the CUDA context). A test walks every
 * site by counting the hits of a clean run, then arming 1, 2, ... (tests/test-fault.c).
 *
 * In a build without ATLAS_FAULT these functions exist but do nothing: arm and hits return
 * 0, fired returns 0 with site "", available returns 0, trace records nothing, and no site
 * is compiled in.
 *
 * Threads: any thread; the counter is atomic, so with several threads allocating the n-th
 * hit is whichever reaches it first. */
#ifndef ATLAS_CORE_FAULT_H
#define ATLAS_CORE_FAULT_H

#include <stdbool.h>
#include <stddef.h>

/* 1 when fault injection is compiled in (ATLAS_FAULT), else 0. */
int atlas_fault_available(void);

/* Resets the hit count and the fired record; n > 0 fails the n-th site reached from now on,
 * once; 0 disarms (the sites are still counted). Returns atlas_fault_available(). */
int atlas_fault_arm(long n);

/* Sites reached since the last atlas_fault_arm (or the start of the process). */
long atlas_fault_hits(void);

/* 1 when the armed fault fired since atlas_fault_arm; site[cap] gets where ("file:line"). */
int atlas_fault_fired(char *site, size_t cap);

/* Where each hit of a run was: with buf non-NULL, hit h (1-based, counted from the next
 * atlas_fault_arm) records its site in buf[h - 1] while h <= cap; NULL stops recording. The
 * buffer is the caller's and must outlive the recording; file is __FILE__, a literal. A
 * walk uses it to skip sites that repeat (the same code for each layer). */
typedef struct atlas_fault_site {
    const char *file;
    int line;
} atlas_fault_site;
void atlas_fault_trace(atlas_fault_site *buf, long cap);

/* A site: counts a hit and returns true when this one is to fail. Used by ATLAS_FAULT_HERE
 * and the allocation wrappers; always false without ATLAS_FAULT. */
bool atlas_fault_point(const char *file, int line);

#ifdef ATLAS_FAULT
#define ATLAS_FAULT_HERE() atlas_fault_point(__FILE__, __LINE__)
#else
#define ATLAS_FAULT_HERE() false
#endif

/* The allocation wrappers core/fault_alloc.h puts in place of the C library's. */
void *atlas_fault_malloc(size_t n, const char *file, int line);
void *atlas_fault_calloc(size_t count, size_t size, const char *file, int line);
void *atlas_fault_realloc(void *p, size_t n, const char *file, int line);
char *atlas_fault_strdup(const char *s, const char *file, int line);
char *atlas_fault_strndup(const char *s, size_t n, const char *file, int line);
void *atlas_fault_aligned_alloc(size_t align, size_t n, const char *file, int line);

#endif
