/* tests/test-meminfo.c — the memory a load may take (core/meminfo.h): MemAvailable, lowered
 * by the tightest cgroup limit less that cgroup's use beyond its reclaimable file cache,
 * cgroup v2 and v1, read from trees of real files made here; and the running system. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "atlas/status.h"
#include "core/meminfo.h"
#include "harness.h"

static char root[512];

/* Writes root/rel (making its directories) with text. */
static void put(const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK_MSG(f != NULL, "%s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

#define GIB "1073741824"

int main(void) {
    if (!harness_mkdtemp(root, sizeof root, "meminfo")) return 1;
    atlas_mem_avail m;

    /* no /proc/meminfo: an error naming it */
    CHECK(atlas_mem_available_at(root, &m) == ATLAS_ERR_IO && strstr(atlas_last_error(), "proc/meminfo"));

    /* MemAvailable alone (no cgroup file) */
    put("proc/meminfo", "MemTotal:       24683748 kB\nMemFree:  100 kB\nMemAvailable:   20971520 kB\n");
    CHECK_OK(atlas_mem_available_at(root, &m));
    CHECK(m.bytes == (size_t)20 << 30 && !strcmp(m.what, "MemAvailable (/proc/meminfo)"));

    /* cgroup v2: 8 GiB limit, 3 GiB used of which 1 GiB inactive file cache: 6 GiB left */
    put("proc/self/cgroup", "0::/box/job\n");
    put("sys/fs/cgroup/box/job/memory.max", "8589934592\n");
    put("sys/fs/cgroup/box/job/memory.current", "3221225472\n");
    put("sys/fs/cgroup/box/job/memory.stat", "anon 2147483648\nfile 1073741824\ninactive_file " GIB "\n");
    CHECK_OK(atlas_mem_available_at(root, &m));
    CHECK_MSG(m.bytes == (size_t)6 << 30, "%zu", m.bytes);
    CHECK_MSG(strstr(m.what, "cgroup memory limit of") && strstr(m.what, "box/job") &&
              strstr(m.what, "8.00 GiB, 2.00 in use"), "%s", m.what);

    /* a tighter parent wins: 4 GiB limit, 1 GiB used */
    put("sys/fs/cgroup/box/memory.max", "4294967296\n");
    put("sys/fs/cgroup/box/memory.current", GIB "\n");
    CHECK_OK(atlas_mem_available_at(root, &m));
    CHECK_MSG(m.bytes == (size_t)3 << 30 && strstr(m.what, "/box ("), "%zu %s", m.bytes, m.what);

    /* "max" is no limit; a limit above MemAvailable leaves MemAvailable */
    put("sys/fs/cgroup/box/memory.max", "max\n");
    put("sys/fs/cgroup/box/job/memory.max", "68719476736\n");
    CHECK_OK(atlas_mem_available_at(root, &m));
    CHECK(m.bytes == (size_t)20 << 30 && strstr(m.what, "MemAvailable"));

    /* over its limit: nothing left */
    put("sys/fs/cgroup/box/job/memory.max", GIB "\n");
    put("sys/fs/cgroup/box/job/memory.current", "3221225472\n");
    put("sys/fs/cgroup/box/job/memory.stat", "inactive_file 0\n");
    CHECK_OK(atlas_mem_available_at(root, &m));
    CHECK(m.bytes == 0);

    /* cgroup v1, the memory controller among others; the root's huge limit is none */
    put("proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/svc\n0::/\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("sys/fs/cgroup/memory/svc/memory.limit_in_bytes", "2147483648\n");
    put("sys/fs/cgroup/memory/svc/memory.usage_in_bytes", GIB "\n");
    put("sys/fs/cgroup/memory/svc/memory.stat", "cache 536870912\ntotal_inactive_file 536870912\n");
    CHECK_OK(atlas_mem_available_at(root, &m));
    CHECK_MSG(m.bytes == (size_t)3 << 29 && strstr(m.what, "memory/svc"), "%zu %s", m.bytes, m.what);

    /* the running system: some memory, and a source */
    CHECK_OK(atlas_mem_available(&m));
    CHECK(m.bytes > 0 && m.what[0]);

    harness_rm_rf(root);
    return harness_finish();
}
