/* core/meminfo.c — see meminfo.h. */
#include "core/meminfo.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void atlas_mem_trim(void) {
#ifdef __GLIBC__
    extern int malloc_trim(size_t pad); /* glibc's <malloc.h>, which the fault build's
                                           allocator macros would rewrite */
    malloc_trim(0);
#endif
}

/* A limit at or above this is "none" (v1 writes 2^63 rounded down to a page). */
#define NO_LIMIT ((uint64_t)1 << 60)

/* The first number of a file, or its "max": 0 read, 1 "max", -1 absent or unreadable. */
static int read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    bool got = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!got) return -1;
    if (!strncmp(buf, "max", 3)) return 1;
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf) return -1;
    *out = v;
    return 0;
}

/* The value of "key N" (or "key: N kB") in a file of such lines; false when absent. */
static bool read_key(const char *path, const char *key, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[256];
    size_t n = strlen(key);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) || (line[n] != ' ' && line[n] != ':' && line[n] != '\t'))
            continue;
        char *p = line + n + (line[n] == ':');
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p) continue;
        *out = v;
        found = true;
    }
    fclose(f);
    return found;
}

static void gib(char *buf, size_t cap, uint64_t b) { snprintf(buf, cap, "%.2f", b / 1073741824.0); }

/* One cgroup directory's room (limit less its use beyond reclaimable file cache); false
 * when it sets no limit. */
static bool cgroup_room(const char *dir, bool v2, uint64_t *room, uint64_t *limit,
                        uint64_t *used) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    uint64_t lim;
    if (read_u64(path, &lim) != 0 || lim >= NO_LIMIT) return false;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    uint64_t use = 0, inactive = 0;
    if (read_u64(path, &use) != 0) use = 0;
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    if (read_key(path, v2 ? "inactive_file" : "total_inactive_file", &inactive) && inactive < use)
        use -= inactive;
    *limit = lim;
    *used = use;
    *room = lim > use ? lim - use : 0;
    return true;
}

/* Walks from base/rel up to base, lowering *out to the tightest cgroup's room. */
static void cgroup_walk(const char *base, const char *rel, bool v2, atlas_mem_avail *out) {
    char dir[4096];
    int n = snprintf(dir, sizeof dir, "%s%s%s", base, *rel == '/' ? "" : "/", rel);
    if (n < 0 || (size_t)n >= sizeof dir) return;
    size_t base_len = strlen(base);
    for (;;) {
        size_t len = strlen(dir);
        while (len > base_len && dir[len - 1] == '/') dir[--len] = '\0';
        uint64_t room, limit, used;
        if (cgroup_room(dir, v2, &room, &limit, &used) && room < out->bytes) {
            char l[16], u[16];
            gib(l, sizeof l, limit);
            gib(u, sizeof u, used);
            out->bytes = (size_t)room;
            snprintf(out->what, sizeof out->what, "the cgroup memory limit of %.90s (%s GiB, "
                     "%s in use)", dir, l, u);
        }
        if (len <= base_len) return;
        char *slash = strrchr(dir + base_len, '/');
        if (!slash) return;
        *slash = '\0';
    }
}

/* Each line of proc/self/cgroup: "0::/path" (v2) or "N:a,memory,b:/path" (v1). */
static void cgroup_limits(const char *root, atlas_mem_avail *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = '\0';
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        bool v2 = !strcmp(line, "0") && !*ctrls;
        bool v1 = false;
        for (const char *p = ctrls; !v2 && *p;) { /* "memory" as one of a comma list */
            size_t k = strcspn(p, ",");
            v1 |= k == 6 && !strncmp(p, "memory", 6);
            p += k + (p[k] == ',');
        }
        if (!v1 && !v2) continue;
        char base[4096];
        snprintf(base, sizeof base, "%s/sys/fs/cgroup%s", root, v1 ? "/memory" : "");
        cgroup_walk(base, rel, v2, out);
    }
    fclose(f);
}

atlas_status atlas_mem_available_at(const char *root, atlas_mem_avail *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(root, "/")) root = "";
    char path[4096];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    uint64_t kib;
    if (!read_key(path, "MemAvailable", &kib))
        return atlas_fail(ATLAS_ERR_IO, "%s: no MemAvailable line (or the file cannot be read)",
                          path);
    out->bytes = (size_t)(kib * 1024);
    snprintf(out->what, sizeof out->what, "MemAvailable (/proc/meminfo)");
    cgroup_limits(root, out);
    return ATLAS_OK;
}

atlas_status atlas_mem_available(atlas_mem_avail *out) { return atlas_mem_available_at("/", out); }
