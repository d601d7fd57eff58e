/* model/load_source.c — where a load reads its weights from: the host tier (the backend's
 * copy of a released model's weights, kept under the model's identity), the page cache or
 * the disk, decided before a byte is read. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/file.h"
#include "model/model_internal.h"

/* Bumped when the device layout of a weight changes for the same files. */
#define LAYOUT_VERSION 1u

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* The identity of the weights a load of dir with p puts on the device: the directory, each
 * file's name, size, modification time, inode and device (summed: readdir's order varies),
 * the tensor-parallel shard and the layout's version.  0: the directory cannot be read (no
 * tier then). */
static uint64_t weights_key(const char *dir, const atlas_model_params *p) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    char real[PATH_MAX];
    const char *name = realpath(dir, real) ? real : dir;
    uint64_t h = fnv(1469598103934665603ull, name, strlen(name));
    uint64_t files = 0;
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
            stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        uint64_t v[5] = {(uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
                         (uint64_t)st.st_mtim.tv_nsec, (uint64_t)st.st_ino, (uint64_t)st.st_dev};
        uint64_t f = fnv(1469598103934665603ull, de->d_name, strlen(de->d_name));
        files += fnv(f, v, sizeof v);
    }
    closedir(d);
    uint32_t shard[3] = {(uint32_t)p->tp_rank, (uint32_t)p->tp_size, LAYOUT_VERSION};
    h = fnv(fnv(h, &files, sizeof files), shard, sizeof shard);
    return h ? h : 1;
}

/* Bytes of the tensors' data in the page cache now, from one page each 2 MiB of a tensor
 * (and its first): an exact count looks up every 4 KiB page, which took 30 ms for a 1.2 GB
 * checkpoint and would take several hundred for a 16 GB one, beside a read of a few tenths
 * of a second. */
static size_t cached_bytes(const atlas_st *st) {
    size_t in = 0;
    for (size_t i = 0, n = atlas_st_count(st); i < n; i++) {
        const atlas_tensor_view *v = atlas_st_at(st, i);
        in += atlas_mem_resident_sampled(v->data, v->nbytes, (size_t)2 << 20);
    }
    return in;
}

atlas_status atlas_model_load_source(atlas_model *m, const atlas_model_params *p,
                                     size_t expect) {
    int hit = 0;
    const char *off = "";
    if (m->be->ops->host_tier) {
        uint64_t key = p->host_cache ? weights_key(m->dir, p) : 0;
        ATLAS_TRY(m->be->ops->host_tier(m->be, key, p->host_cache, expect, &hit, &off));
    }
    m->tier_off = p->host_cache ? off : "";
    size_t total = atlas_st_total_bytes(m->st);
    if (hit) {
        m->load_source = "host";
        m->load_cached = total;
        return ATLAS_OK;
    }
    m->load_cached = cached_bytes(m->st);
    m->load_source = m->load_cached >= total ? "page_cache" : "disk";
    return ATLAS_OK;
}
