/* backend/cuda/host_tier.c — released models' weights in pinned host memory (host_tier.h).
 *
 * Globals (docs/ARCHITECTURE.md, "Globals"): the tier itself under tier_lock, process-wide
 * as the host and its staging pool are: pinned chunks outlive the models that filled them. */
#include "backend/cuda/host_tier.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/fault.h"
#include "core/threadpool.h"

#define TIER_CHUNK_MIN ((size_t)1 << 20)
/* A chunk is one cuMemHostAlloc, and the driver runs no other call of the context while it
 * pins (about 1.5 GB/s): 32 MiB holds a serving step's launch about 21 ms at most, where
 * 256 MiB held it 170 ms; the staging pool pins 16 MiB a call at the same rate, so smaller
 * calls cost no throughput.  Between two chunks the fill pauses TIER_PIN_GAP_NS: a thread
 * that waits for the driver gets it then (at start, one waited through all 32 of the staging
 * pool's calls made back to back), so the wait is one chunk, not the whole fill. */
#define TIER_CHUNK_MAX ((size_t)32 << 20)
#define TIER_PIN_GAP_NS (1000 * 1000)

typedef struct tier_entry {
    struct tier_entry *next;
    uint64_t key;
    char **chunks;       /* [n_chunks] of `chunk` bytes each: the image, end to end */
    int n_chunks, cap_chunks;
    size_t chunk;
    size_t used;         /* the image's bytes */
    size_t *rec;         /* [n_rec] each upload's bytes, in order */
    int n_rec, cap_rec;
    int users;           /* loads reading or filling it: never evicted meanwhile */
    int complete;        /* a fill that ended well: hits may read it */
    uint64_t last_use;
} tier_entry;

struct atlas_tier_use {
    tier_entry *e;       /* NULL once a fill's thread has ended it (kept or dropped) */
    int hit;
    int bad;             /* a hit whose sizes differed: dropped at close */
    int given_up;        /* a fill out of room: nothing kept, dropped at close */
    int next_rec;        /* a hit's next upload */
    size_t at;           /* a hit's next byte */
    /* a fill: the device address of each recorded upload, copied back after the load */
    CUdeviceptr *dst;
    int cap_dst;
    atlas_host *host;
    pthread_t thread;
    int started;         /* the copy thread runs (join it) */
    atomic_int stop;     /* the model goes: the copy ends at its next chunk */
    size_t reserve;      /* of tier.filling: this fill's chunks not yet taken */
};

static pthread_mutex_t tier_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    tier_entry *entries;
    char **free;         /* chunks of free_chunk bytes kept for the next fill */
    int n_free, cap_free;
    size_t free_chunk;
    size_t budget, pinned, filling;
    uint64_t clock;
    atlas_tier_stats st;
} tier;

size_t atlas_host_tier_chunk_for(size_t budget) {
    size_t c = budget / 16 & ~(TIER_CHUNK_MIN - 1);
    return c < TIER_CHUNK_MIN ? TIER_CHUNK_MIN : c > TIER_CHUNK_MAX ? TIER_CHUNK_MAX : c;
}

const char *atlas_host_tier_off_reason(const atlas_host *host) {
    const atlas_host_props *p = atlas_host_properties(host);
    if (p->integrated)
        return "the GPU is integrated: it shares the host's memory, and a host copy of the "
               "weights would be a second copy in the same DRAM";
    if (p->host_page_tables)
        return "the GPU reads host memory through the host's page tables (unified memory): a "
               "host copy of the weights would be a second copy in the same DRAM";
    return "";
}

/* ---- chunks and entries (under tier_lock) ----------------------------------------------- */

static void chunk_release(char *c, size_t bytes) {
    if (!c) return;
    atlas_driver_get()->cuMemFreeHost(c); /* a failure leaks pinned memory: nothing to undo */
    tier.pinned -= bytes;
}

/* An entry's chunks go to the free list (its chunk size the list's) or are freed. */
static void entry_drop(tier_entry *e) {
    for (tier_entry **p = &tier.entries; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    for (int i = 0; i < e->n_chunks; i++) {
        int keep = e->chunk == tier.free_chunk && tier.n_free < tier.cap_free;
        if (keep) tier.free[tier.n_free++] = e->chunks[i];
        else chunk_release(e->chunks[i], e->chunk);
    }
    if (e->complete) tier.st.held -= e->used, tier.st.entries--;
    free(e->chunks);
    free(e->rec);
    free(e);
}

/* The least recently used entry nobody reads or fills, or NULL. */
static tier_entry *lru_victim(void) {
    tier_entry *v = NULL;
    for (tier_entry *e = tier.entries; e; e = e->next)
        if (e->complete && !e->users && (!v || e->last_use < v->last_use)) v = e;
    return v;
}

/* Frees free chunks, then evicts whole entries, until the pinned bytes fit `room` less. */
static int make_room(size_t room) {
    while (tier.pinned + room > tier.budget) {
        if (tier.n_free > 0) {
            chunk_release(tier.free[--tier.n_free], tier.free_chunk);
            continue;
        }
        tier_entry *v = lru_victim();
        if (!v) return 0;
        tier.st.evicted++;
        entry_drop(v);
    }
    return 1;
}

/* Sets the budget and the chunk size that goes with it: free chunks of another size, and
 * whatever no longer fits, go. */
static void set_budget(size_t budget) {
    size_t chunk = atlas_host_tier_chunk_for(budget);
    tier.budget = budget;
    tier.st.budget = budget;
    if (chunk != tier.free_chunk) {
        while (tier.n_free > 0) chunk_release(tier.free[--tier.n_free], tier.free_chunk);
        tier.free_chunk = chunk;
        free(tier.free);
        tier.cap_free = budget ? (int)(budget / chunk) + 1 : 0;
        tier.free = tier.cap_free ? malloc((size_t)tier.cap_free * sizeof *tier.free) : NULL;
        if (!tier.free) tier.cap_free = 0; /* evicted chunks are freed instead */
    }
    make_room(0);
}

static tier_entry *find(uint64_t key) {
    for (tier_entry *e = tier.entries; e; e = e->next)
        if (e->key == key) return e;
    return NULL;
}

/* ---- a load's use ----------------------------------------------------------------------- */

static atlas_status open_locked(uint64_t key, size_t expect, atlas_tier_use *u) {
    tier_entry *e = find(key);
    if (e && !e->complete) return ATLAS_ERR_BUSY; /* being filled by another load */
    if (e) {
        e->users++;
        e->last_use = ++tier.clock;
        u->e = e;
        u->hit = 1;
        tier.st.hits++;
        return ATLAS_OK;
    }
    if (expect > tier.budget) return ATLAS_ERR_BUSY;
    e = calloc(1, sizeof *e);
    if (!e) return atlas_fail(ATLAS_ERR_NOMEM, "host tier: out of memory");
    *e = (tier_entry){.next = tier.entries, .key = key, .chunk = tier.free_chunk, .users = 1};
    tier.entries = e;
    u->e = e;
    return ATLAS_OK;
}

atlas_status atlas_host_tier_open(atlas_host *host, uint64_t key, size_t budget, size_t expect,
                                  atlas_tier_use **out) {
    *out = NULL;
    if (*atlas_host_tier_off_reason(host)) budget = 0;
    atlas_tier_use *u = calloc(1, sizeof *u);
    if (!u) return atlas_fail(ATLAS_ERR_NOMEM, "host tier: out of memory");
    pthread_mutex_lock(&tier_lock);
    set_budget(budget);
    atlas_status st = budget && key ? open_locked(key, expect, u) : ATLAS_ERR_BUSY;
    pthread_mutex_unlock(&tier_lock);
    if (st == ATLAS_OK) {
        *out = u;
        return ATLAS_OK;
    }
    free(u);
    return st == ATLAS_ERR_BUSY ? ATLAS_OK : st; /* no tier for this load */
}

int atlas_tier_use_hit(const atlas_tier_use *u) { return u && u->hit; }

/* A hit: the next recorded upload, copied chunk by chunk from the image. */
static atlas_status replay(atlas_host *host, atlas_tier_use *u, CUdeviceptr dst, size_t bytes) {
    tier_entry *e = u->e;
    if (u->bad || u->next_rec >= e->n_rec || e->rec[u->next_rec] != bytes) {
        u->bad = 1;
        return atlas_fail(ATLAS_ERR_INTERNAL, "host tier: upload %d of %zu bytes, the kept "
                          "image recorded %zu: the image is dropped; load again", u->next_rec,
                          bytes, u->next_rec < e->n_rec ? e->rec[u->next_rec] : 0);
    }
    CUstream s = atlas_host_copy_stream(host);
    for (size_t done = 0; done < bytes;) {
        size_t at = u->at + done, in = at % e->chunk;
        size_t n = e->chunk - in < bytes - done ? e->chunk - in : bytes - done;
        ATLAS_CU_TRY(cuMemcpyHtoDAsync, dst + done, e->chunks[at / e->chunk] + in, n, s);
        done += n;
    }
    u->at += bytes;
    u->next_rec++;
    return ATLAS_OK;
}

/* A fill's load: records the upload (its size in the entry, its device address in u), within
 * the budget; the bytes go to the device through the staging pool as in any load, and come
 * back into pinned memory after it (fill_main). */
static atlas_status record(atlas_tier_use *u, CUdeviceptr dst, size_t bytes) {
    tier_entry *e = u->e;
    if (e->used + bytes > tier.budget) return ATLAS_ERR_NOMEM;
    if (e->n_rec == e->cap_rec) {
        int cap = e->cap_rec ? 2 * e->cap_rec : 256;
        size_t *r = realloc(e->rec, (size_t)cap * sizeof *r);
        if (!r) return ATLAS_ERR_NOMEM;
        e->rec = r, e->cap_rec = cap;
    }
    if (e->n_rec == u->cap_dst) {
        int cap = u->cap_dst ? 2 * u->cap_dst : 256;
        CUdeviceptr *d = realloc(u->dst, (size_t)cap * sizeof *d);
        if (!d) return ATLAS_ERR_NOMEM;
        u->dst = d, u->cap_dst = cap;
    }
    u->dst[e->n_rec] = dst;
    e->rec[e->n_rec++] = bytes;
    e->used += bytes;
    return ATLAS_OK;
}

atlas_status atlas_tier_upload(atlas_host *host, atlas_tier_use *u, CUdeviceptr dst,
                               size_t bytes, atlas_host_fill_fn fill, const void *ctx,
                               size_t ctx_bytes) {
    if (u && u->hit && !u->given_up && bytes) return replay(host, u, dst, bytes);
    if (u && !u->hit && !u->given_up && bytes && record(u, dst, bytes) != ATLAS_OK)
        u->given_up = 1; /* out of room: this load keeps no image */
    return atlas_host_upload_queue(host, dst, bytes, fill, ctx, ctx_bytes);
}

/* The fill's chunks, one at a time: a free one, else room made and a new one pinned outside
 * the lock (pinning runs at about 1.5 GB/s: the tier's other users must not wait on it). */
static atlas_status fill_chunks(atlas_tier_use *u) {
    tier_entry *e = u->e;
    size_t need = (e->used + e->chunk - 1) / e->chunk;
    while ((size_t)e->n_chunks < need) {
        if (atomic_load(&u->stop)) return ATLAS_ERR_BUSY;
        char *c = NULL;
        atlas_status st = ATLAS_OK;
        pthread_mutex_lock(&tier_lock);
        if (e->n_chunks == e->cap_chunks) {
            int cap = e->cap_chunks ? 2 * e->cap_chunks : 64;
            char **cs = realloc(e->chunks, (size_t)cap * sizeof *cs);
            if (cs) e->chunks = cs, e->cap_chunks = cap;
            else st = ATLAS_ERR_NOMEM;
        }
        if (st == ATLAS_OK && tier.n_free > 0 && tier.free_chunk == e->chunk)
            c = tier.free[--tier.n_free];
        else if (st == ATLAS_OK && make_room(e->chunk))
            tier.pinned += e->chunk; /* the new chunk's room, taken before it is pinned */
        else
            st = ATLAS_ERR_NOMEM;
        pthread_mutex_unlock(&tier_lock);
        if (st == ATLAS_OK && !c) {
            void *p = NULL;
            /* a fault site (core/fault.h): pinned memory short, as the driver would say */
            st = ATLAS_FAULT_HERE()
                     ? atlas_cu_check(ATLAS_CUDA_ERROR_OUT_OF_MEMORY,
                                      "cuMemHostAlloc (injected fault)", __FILE__, __LINE__)
                     : ATLAS_CU(cuMemHostAlloc, &p, e->chunk, ATLAS_CU_MEMHOSTALLOC_PORTABLE);
            c = p;
            if (st != ATLAS_OK) {
                pthread_mutex_lock(&tier_lock);
                tier.pinned -= e->chunk;
                pthread_mutex_unlock(&tier_lock);
            }
            struct timespec gap = {0, TIER_PIN_GAP_NS}; /* the driver free for a waiter */
            nanosleep(&gap, NULL);
        }
        if (st != ATLAS_OK) return st;
        pthread_mutex_lock(&tier_lock);
        e->chunks[e->n_chunks++] = c;
        size_t less = u->reserve < e->chunk ? u->reserve : e->chunk;
        u->reserve -= less;
        tier.filling -= less;
        pthread_mutex_unlock(&tier_lock);
    }
    return ATLAS_OK;
}

/* Copies each recorded upload back from the device into the image, end to end, on a stream
 * of its own (beside the copy stream's uploads and the model's kernels). */
static atlas_status fill_copy(atlas_tier_use *u) {
    tier_entry *e = u->e;
    CUstream s = NULL;
    ATLAS_CU_TRY(cuStreamCreate, &s, ATLAS_CU_STREAM_NON_BLOCKING);
    atlas_status st = ATLAS_OK;
    size_t at = 0;
    for (int i = 0; st == ATLAS_OK && i < e->n_rec; i++) {
        for (size_t done = 0; st == ATLAS_OK && done < e->rec[i];) {
            size_t in = at % e->chunk, n = e->chunk - in;
            if (n > e->rec[i] - done) n = e->rec[i] - done;
            st = atomic_load(&u->stop) ? ATLAS_ERR_BUSY
                 : ATLAS_CU(cuMemcpyDtoHAsync, e->chunks[at / e->chunk] + in, u->dst[i] + done,
                            n, s);
            if (st == ATLAS_OK && in + n == e->chunk) /* a chunk a wait: stop stays prompt */
                st = ATLAS_CU(cuStreamSynchronize, s);
            done += n, at += n;
        }
    }
    atlas_status sync = ATLAS_CU(cuStreamSynchronize, s);
    atlas_driver_get()->cuStreamDestroy(s);
    return st != ATLAS_OK ? st : sync;
}

/* The end of a fill (st: how it went): the entry is kept whole or dropped (its chunks kept
 * free for the next fill), and the use no longer holds it. */
static void fill_finish(atlas_tier_use *u, atlas_status st) {
    pthread_mutex_lock(&tier_lock);
    tier_entry *e = u->e;
    e->users--;
    e->last_use = ++tier.clock;
    if (st == ATLAS_OK) {
        e->complete = 1;
        tier.st.held += e->used;
        tier.st.entries++;
        tier.st.fills++;
    } else {
        tier.st.abandoned += !atomic_load(&u->stop);
        entry_drop(e);
    }
    u->e = NULL;
    tier.filling -= u->reserve;
    u->reserve = 0;
    make_room(0);
    pthread_mutex_unlock(&tier_lock);
}

/* The fill after its model's load: chunks, then the copies. */
static void *fill_main(void *arg) {
    atlas_tier_use *u = arg;
    atlas_thread_background(); /* a copy for later: serving goes first */
    atlas_status st = atlas_host_make_current(u->host);
    if (st == ATLAS_OK) st = fill_chunks(u);
    if (st == ATLAS_OK) st = fill_copy(u);
    atlas_error_clear(); /* an image not kept is no error: the next load reads the files */
    fill_finish(u, st);
    return NULL;
}

static void use_free(atlas_tier_use *u) {
    free(u->dst);
    free(u);
}

atlas_tier_use *atlas_tier_close(atlas_host *host, atlas_tier_use *u, int ok) {
    if (!u) return NULL;
    u->host = host;
    if (!u->hit && ok && !u->given_up && u->e->n_rec > 0) {
        pthread_mutex_lock(&tier_lock);
        u->reserve = (u->e->used + u->e->chunk - 1) / u->e->chunk * u->e->chunk;
        tier.filling += u->reserve;
        pthread_mutex_unlock(&tier_lock);
        return u; /* the fill waits for atlas_tier_fill_start */
    }
    pthread_mutex_lock(&tier_lock);
    tier_entry *e = u->e;
    e->users--;
    e->last_use = ++tier.clock;
    if (!u->hit) {
        tier.st.abandoned += u->given_up;
        entry_drop(e); /* a failed load, one out of room, or nothing to keep */
    } else if (u->bad) {
        entry_drop(e);
    }
    make_room(0); /* a budget lowered while it was read */
    pthread_mutex_unlock(&tier_lock);
    use_free(u);
    return NULL;
}

void atlas_tier_fill_start(atlas_tier_use *u) {
    if (!u || u->started || !u->e) return;
    if (pthread_create(&u->thread, NULL, fill_main, u) == 0) u->started = 1;
    else fill_finish(u, ATLAS_ERR_NOMEM); /* no thread: no image, counted as abandoned */
}

void atlas_tier_fill_end(atlas_tier_use *u, int wait) {
    if (!u) return;
    if (!wait) atomic_store(&u->stop, 1);
    if (u->started) pthread_join(u->thread, NULL);
    else if (u->e && wait) fill_main(u); /* never started: it runs here */
    else if (u->e) fill_finish(u, ATLAS_ERR_BUSY); /* never started: nothing kept */
    use_free(u);
}

void atlas_host_tier_stats(atlas_tier_stats *out) {
    pthread_mutex_lock(&tier_lock);
    *out = tier.st;
    out->pinned = tier.pinned;
    out->filling = tier.filling;
    pthread_mutex_unlock(&tier_lock);
}
