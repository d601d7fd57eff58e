/* core/meminfo.h — how much memory this process may still take, for the check a load makes
 * before it reads any weight.  Internal.
 *
 * MemAvailable of /proc/meminfo (what the kernel can hand out without swapping: free
 * memory plus reclaimable cache), lowered by the memory limit of the process's cgroup and
 * of each cgroup above it (v2 memory.max, v1 memory.limit_in_bytes), less what that cgroup
 * uses beyond its reclaimable file cache: a container's limit is where the OOM killer
 * strikes, whatever the machine has free. */
#ifndef ATLAS_CORE_MEMINFO_H
#define ATLAS_CORE_MEMINFO_H

#include <stddef.h>

#include "atlas/status.h"

typedef struct atlas_mem_avail {
    size_t bytes;   /* what may still be taken */
    char what[200]; /* where the figure comes from, for messages: "MemAvailable (/proc/meminfo)"
                       or "the cgroup memory limit of /sys/fs/cgroup/...: 8.00 GiB, 1.20 in use" */
} atlas_mem_avail;

/* Fills *out from the running system.  ATLAS_ERR_IO when /proc/meminfo cannot be read or
 * has no MemAvailable (a kernel before 3.14): the caller then has no figure to check. */
atlas_status atlas_mem_available(atlas_mem_avail *out);

/* The same with every path under root ("/" for the system): for tests, a directory that
 * holds proc/meminfo, proc/self/cgroup and sys/fs/cgroup/... of the tests' own making. */
atlas_status atlas_mem_available_at(const char *root, atlas_mem_avail *out);

/* Hands the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere):
 * a load's and a release's transient buffers, freed between blocks that stay, would
 * otherwise stay in the process's resident memory. */
void atlas_mem_trim(void);

#endif
