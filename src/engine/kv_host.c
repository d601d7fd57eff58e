/* engine/kv_host.c — released models' prefix KV in host memory (see kv_host.h). */
#include "engine/kv_host.h"

#include <stdlib.h>
#include <string.h>

#include "atlas/host.h"
#include "core/error.h"
#include "model/forward.h"

typedef struct kvh_entry {
    int model;          /* -1: a free slot */
    int32_t parent;     /* the entry of the block before it; -1: a first block */
    int n_children;     /* entries whose parent it is */
    uint64_t h;         /* its key in the map: of (model, parent or salt) then tokens */
    uint64_t pass;      /* the save that last kept it */
    int32_t prev, next; /* the order of use, least recent first */
    int32_t *toks;      /* [block_size] */
    char *salt;         /* a first block's (salt_len bytes); NULL: none */
    size_t salt_len;
    void *kv;           /* [kv_bytes] the K/V image */
    size_t kv_bytes;
    size_t bytes;       /* what it counts against the budget */
} kvh_entry;

typedef struct kvh_spare {
    void *p;
    size_t bytes;
} kvh_spare;

typedef struct kvh_model {
    int set;            /* ident holds the identity its entries were saved under */
    atlas_kv_host_ident ident;
    int n;              /* its entries */
} kvh_model;

struct atlas_kv_host {
    size_t budget, bytes;
    kvh_entry *e;       /* [cap] */
    int cap, n_live;
    int32_t *free_ids;  /* [cap] free slots */
    int n_free;
    int32_t *map;       /* [map_cap] open addressing: key -> entry, -1 empty */
    int map_cap;
    int32_t head, tail;
    uint64_t key[2], passes;
    kvh_model *models;  /* [n_models] */
    int n_models;
    /* with a GPU the images are pinned memory, whose copies run at the bus's rate; a dropped
     * entry's image is kept as a spare for the next save (pinning costs more than the copy),
     * never more of them than the budget leaves beside the entries */
    atlas_host *host;   /* NULL: plain memory */
    kvh_spare *spare;   /* [cap_spare] */
    int n_spare, cap_spare;
    size_t spare_bytes;
};

/* ---- images ----------------------------------------------------------------------------- */

static void *image_alloc(atlas_kv_host *h, size_t bytes) {
    if (!h->host) return malloc(bytes);
    for (int i = h->n_spare - 1; i >= 0; i--)
        if (h->spare[i].bytes == bytes) {
            void *p = h->spare[i].p;
            h->spare[i] = h->spare[--h->n_spare];
            h->spare_bytes -= bytes;
            return p;
        }
    void *p = NULL;
    if (atlas_host_alloc_pinned(h->host, bytes, &p) != ATLAS_OK) {
        atlas_error_clear(); /* the save keeps what it has (kv_host.h) */
        return NULL;
    }
    return p;
}

/* Frees spares until the entries and they fit the budget. */
static void spares_trim(atlas_kv_host *h) {
    while (h->n_spare && h->bytes + h->spare_bytes > h->budget) {
        kvh_spare x = h->spare[--h->n_spare];
        atlas_host_free_pinned(h->host, x.p);
        h->spare_bytes -= x.bytes;
    }
}

static void image_free(atlas_kv_host *h, void *p, size_t bytes) {
    if (!p) return;
    if (!h->host) {
        free(p);
        return;
    }
    if (h->n_spare == h->cap_spare) {
        int cap = h->cap_spare ? 2 * h->cap_spare : 64;
        kvh_spare *grown = realloc(h->spare, (size_t)cap * sizeof *grown);
        if (!grown) {
            atlas_host_free_pinned(h->host, p);
            return;
        }
        h->spare = grown;
        h->cap_spare = cap;
    }
    h->spare[h->n_spare++] = (kvh_spare){p, bytes};
    h->spare_bytes += bytes;
    spares_trim(h);
}

/* ---- keys and the map ------------------------------------------------------------------- */

/* The key of an entry: its model and parent (a first block: its model and salt) then its
 * tokens.  The key only finds candidates; find() proves them. */
static uint64_t entry_key(const atlas_kv_host *h, int model, int32_t parent, const char *salt,
                          size_t salt_len, const int32_t *toks, int bs) {
    uint64_t prev = ((uint64_t)(uint32_t)model << 32) | (uint32_t)(parent + 1);
    if (parent < 0 && salt_len) prev = atlas_kv_siphash(h->key, prev, salt, salt_len);
    return atlas_kv_siphash(h->key, prev, toks, (size_t)bs * sizeof *toks);
}

static int home(const atlas_kv_host *h, uint64_t k) {
    return (int)(k & (uint64_t)(h->map_cap - 1));
}

static int32_t find(const atlas_kv_host *h, int model, int32_t parent, const char *salt,
                    size_t salt_len, const int32_t *toks, int bs) {
    if (!h->map_cap) return -1;
    uint64_t k = entry_key(h, model, parent, salt, salt_len, toks, bs);
    for (int i = home(h, k);; i = (i + 1) & (h->map_cap - 1)) {
        int32_t id = h->map[i];
        if (id < 0) return -1;
        const kvh_entry *x = &h->e[id];
        if (x->h != k || x->model != model || x->parent != parent ||
            memcmp(x->toks, toks, (size_t)bs * sizeof *toks))
            continue;
        if (parent >= 0 || (x->salt_len == salt_len && (!salt_len || !memcmp(x->salt, salt,
                                                                              salt_len))))
            return id;
    }
}

static void map_put(atlas_kv_host *h, int32_t id) {
    int i = home(h, h->e[id].h);
    while (h->map[i] >= 0) i = (i + 1) & (h->map_cap - 1);
    h->map[i] = id;
}

static void map_delete(atlas_kv_host *h, int32_t id) {
    int mask = h->map_cap - 1, i = home(h, h->e[id].h);
    while (h->map[i] != id) i = (i + 1) & mask;
    for (int j = i;;) {
        j = (j + 1) & mask;
        if (h->map[j] < 0) break;
        int k = home(h, h->e[h->map[j]].h);
        int movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
        if (movable) {
            h->map[i] = h->map[j];
            i = j;
        }
    }
    h->map[i] = -1;
}

/* Room for one more entry: the slots and a map at most half full. */
static atlas_status grow(atlas_kv_host *h) {
    if (h->n_free == 0) {
        int cap = h->cap ? 2 * h->cap : 64;
        kvh_entry *e = realloc(h->e, (size_t)cap * sizeof *e);
        if (!e) return atlas_fail(ATLAS_ERR_NOMEM, "kv host store: %d entries", cap);
        h->e = e;
        int32_t *f = realloc(h->free_ids, (size_t)cap * sizeof *f);
        if (!f) return atlas_fail(ATLAS_ERR_NOMEM, "kv host store: %d entries", cap);
        h->free_ids = f;
        for (int i = cap - 1; i >= h->cap; i--) {
            h->e[i] = (kvh_entry){.model = -1};
            h->free_ids[h->n_free++] = i;
        }
        h->cap = cap;
    }
    if (2 * (h->n_live + 1) <= h->map_cap) return ATLAS_OK;
    int mc = h->map_cap ? 2 * h->map_cap : 128;
    int32_t *map = malloc((size_t)mc * sizeof *map);
    if (!map) return atlas_fail(ATLAS_ERR_NOMEM, "kv host store: a map of %d", mc);
    free(h->map);
    h->map = map;
    h->map_cap = mc;
    for (int i = 0; i < mc; i++) map[i] = -1;
    for (int i = 0; i < h->cap; i++)
        if (h->e[i].model >= 0) map_put(h, i);
    return ATLAS_OK;
}

/* ---- the order of use ------------------------------------------------------------------- */

static void unlink_entry(atlas_kv_host *h, int32_t id) {
    kvh_entry *x = &h->e[id];
    if (x->prev >= 0) h->e[x->prev].next = x->next;
    else h->head = x->next;
    if (x->next >= 0) h->e[x->next].prev = x->prev;
    else h->tail = x->prev;
}

static void append(atlas_kv_host *h, int32_t id) {
    kvh_entry *x = &h->e[id];
    x->prev = h->tail;
    x->next = -1;
    if (h->tail >= 0) h->e[h->tail].next = id;
    else h->head = id;
    h->tail = id;
}

/* Makes entries ids[n], listed parents first, the most recent, each more recent than its
 * continuations: the least recent entry is then always one that no other continues. */
static void touch(atlas_kv_host *h, const int32_t *ids, int n) {
    for (int i = n - 1; i >= 0; i--) {
        unlink_entry(h, ids[i]);
        append(h, ids[i]);
    }
}

static void drop(atlas_kv_host *h, int32_t id) {
    kvh_entry *x = &h->e[id];
    map_delete(h, id);
    unlink_entry(h, id);
    if (x->parent >= 0) h->e[x->parent].n_children--;
    h->models[x->model].n--;
    h->bytes -= x->bytes;
    free(x->toks);
    free(x->salt);
    image_free(h, x->kv, x->kv_bytes);
    *x = (kvh_entry){.model = -1};
    h->free_ids[h->n_free++] = id;
    h->n_live--;
}

/* ---- the store -------------------------------------------------------------------------- */

atlas_status atlas_kv_host_create(size_t budget, int n_models, atlas_host *host,
                                  atlas_kv_host **out) {
    *out = NULL;
    atlas_kv_host *h = calloc(1, sizeof *h);
    if (!h || !(h->models = calloc((size_t)(n_models > 0 ? n_models : 1), sizeof *h->models))) {
        free(h);
        return atlas_fail(ATLAS_ERR_NOMEM, "kv host store for %d models", n_models);
    }
    h->budget = budget;
    h->n_models = n_models;
    h->host = host;
    h->head = h->tail = -1;
    atlas_status st = atlas_kv_random_key(h->key);
    if (st != ATLAS_OK) {
        atlas_kv_host_free(h);
        return st;
    }
    *out = h;
    return ATLAS_OK;
}

void atlas_kv_host_free(atlas_kv_host *h) {
    if (!h) return;
    for (int i = 0; i < h->cap; i++)
        if (h->e[i].model >= 0) {
            free(h->e[i].toks);
            free(h->e[i].salt);
            if (h->host) atlas_host_free_pinned(h->host, h->e[i].kv);
            else free(h->e[i].kv);
        }
    for (int i = 0; i < h->n_spare; i++) atlas_host_free_pinned(h->host, h->spare[i].p);
    free(h->spare);
    free(h->e);
    free(h->free_ids);
    free(h->map);
    free(h->models);
    free(h);
}

size_t atlas_kv_host_bytes(const atlas_kv_host *h) { return h ? h->bytes : 0; }
size_t atlas_kv_host_budget(const atlas_kv_host *h) { return h ? h->budget : 0; }
int atlas_kv_host_blocks(const atlas_kv_host *h) { return h ? h->n_live : 0; }

static int same_ident(const atlas_kv_host_ident *a, const atlas_kv_host_ident *b) {
    return a->files == b->files && a->block_bytes == b->block_bytes &&
           a->block_size == b->block_size && a->n_layers == b->n_layers &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           !strcmp(a->kv_dtype, b->kv_dtype) && !strcmp(a->backend, b->backend);
}

/* Drops every entry of model, continuations before the blocks they continue. */
static uint64_t drop_model(atlas_kv_host *h, int model) {
    uint64_t n = 0;
    /* every entry is more recent than its continuations: dropping from the least recent
     * end never leaves a continuation without the block before it */
    for (int32_t id = h->head; id >= 0;) {
        int32_t next = h->e[id].next;
        if (h->e[id].model == model) {
            drop(h, id);
            n++;
        }
        id = next;
    }
    return n;
}

void atlas_kv_host_check(atlas_kv_host *h, int model, const atlas_kv_host_ident *id,
                         atlas_kv_host_moved *out) {
    *out = (atlas_kv_host_moved){0};
    if (!h || model < 0 || model >= h->n_models) return;
    kvh_model *km = &h->models[model];
    if (km->set && !same_ident(&km->ident, id)) out->dropped = drop_model(h, model);
    km->ident = *id;
    km->set = 1;
}

/* Makes room for need more bytes by evicting the least recent entries, none that save pass
 * kept.  0: there is none. */
static int make_room(atlas_kv_host *h, size_t need, uint64_t pass, uint64_t *dropped) {
    while (h->bytes + need > h->budget) {
        int32_t id = h->head;
        if (id < 0 || h->e[id].pass == pass || h->e[id].n_children) return 0;
        drop(h, id);
        (*dropped)++;
    }
    return 1;
}

uint64_t atlas_kv_host_set_budget(atlas_kv_host *h, size_t budget) {
    uint64_t dropped = 0;
    if (!h) return 0;
    h->budget = budget;
    make_room(h, 0, UINT64_MAX, &dropped); /* no save's pass: any entry may go */
    spares_trim(h);
    return dropped;
}

/* A new entry for the block ids of p, after parent (-1: first), its image allocated; -1 when
 * no memory. */
static int32_t add_entry(atlas_kv_host *h, int model, int32_t parent, const atlas_kv_pool *p,
                         int32_t block, size_t block_bytes, size_t need, uint64_t pass) {
    if (grow(h) != ATLAS_OK) return -1;
    size_t bs = (size_t)p->block_size;
    const atlas_kv_block *b = &p->blk[block];
    size_t salt_len = parent < 0 ? b->salt_len : 0;
    kvh_entry x = {.model = model, .parent = parent, .pass = pass, .bytes = need,
                   .salt_len = salt_len, .kv_bytes = block_bytes};
    x.toks = malloc(bs * sizeof *x.toks);
    x.salt = salt_len ? malloc(salt_len) : NULL;
    x.kv = image_alloc(h, block_bytes);
    if (!x.toks || !x.kv || (salt_len && !x.salt)) {
        free(x.toks);
        free(x.salt);
        image_free(h, x.kv, block_bytes);
        return -1;
    }
    memcpy(x.toks, p->toks + (size_t)block * bs, bs * sizeof *x.toks);
    if (salt_len) memcpy(x.salt, b->salt, salt_len);
    x.h = entry_key(h, model, parent, x.salt, salt_len, x.toks, (int)bs);
    int32_t id = h->free_ids[--h->n_free];
    h->e[id] = x;
    map_put(h, id);
    append(h, id);
    if (parent >= 0) h->e[parent].n_children++;
    h->models[model].n++;
    h->bytes += need;
    h->n_live++;
    spares_trim(h);
    return id;
}

/* Indices into the pool's chains (ids, parent: atlas_kv_pool_chains) in order of depth,
 * first blocks first, into order[n] (a counting sort; count has n + 1 entries). */
static void by_depth(const int32_t *parent, int n, int32_t *depth, int32_t *count,
                     int32_t *order) {
    for (int i = 0; i <= n; i++) count[i] = 0;
    for (int i = 0; i < n; i++) { /* parents come before their continuations */
        depth[i] = parent[i] < 0 ? 0 : depth[parent[i]] + 1;
        count[depth[i] + 1]++;
    }
    for (int i = 1; i <= n; i++) count[i] += count[i - 1];
    for (int i = 0; i < n; i++) order[count[depth[i]]++] = i;
}

/* The save's scratch arrays, one allocation. */
typedef struct save_scratch {
    int32_t *ids, *parent, *depth, *count, *order, *ent, *kept, *copy_ids, *copy_ent;
    void **dst;
} save_scratch;

static int scratch_alloc(save_scratch *s, int n) {
    size_t i32 = (size_t)(n + 1) * sizeof(int32_t);
    char *b = malloc(9 * i32 + (size_t)(n + 1) * sizeof(void *));
    if (!b) return 0;
    int32_t **arr[] = {&s->ids, &s->parent, &s->depth, &s->count, &s->order, &s->ent,
                       &s->kept, &s->copy_ids, &s->copy_ent};
    s->dst = (void **)b; /* first: the pointers' alignment */
    size_t at = (size_t)(n + 1) * sizeof(void *);
    for (int i = 0; i < 9; i++) *arr[i] = (int32_t *)(b + at + (size_t)i * i32);
    return 1;
}

void atlas_kv_host_save(atlas_kv_host *h, int model, const atlas_kv_host_ident *id,
                        atlas_model *m, const atlas_kv_pool *p, atlas_kv_host_moved *out) {
    *out = (atlas_kv_host_moved){0};
    size_t bb = atlas_model_kv_block_bytes(m);
    if (!h || !h->budget || model < 0 || model >= h->n_models || !bb || bb != id->block_bytes)
        return;
    atlas_kv_host_check(h, model, id, out);
    save_scratch s;
    if (!scratch_alloc(&s, p->n_blocks)) return;
    int n = atlas_kv_pool_chains(p, s.ids, s.parent), n_kept = 0, nc = 0;
    by_depth(s.parent, n, s.depth, s.count, s.order);
    uint64_t pass = ++h->passes;
    int bs = p->block_size;
    for (int k = 0; k < n; k++) {
        int i = s.order[k];
        int32_t pe = s.parent[i] < 0 ? -1 : s.ent[s.parent[i]];
        s.ent[i] = -1;
        if (s.parent[i] >= 0 && pe < 0) continue; /* the block before it was not kept */
        const atlas_kv_block *b = &p->blk[s.ids[i]];
        const int32_t *toks = p->toks + (size_t)s.ids[i] * (size_t)bs;
        int32_t x = find(h, model, pe, b->salt, b->salt_len, toks, bs);
        if (x >= 0) { /* saved before (or restored from here): its image is the same */
            h->e[x].pass = pass;
            unlink_entry(h, x);
            append(h, x);
        } else {
            size_t need = bb + (size_t)bs * sizeof *toks + (pe < 0 ? b->salt_len : 0);
            if (!make_room(h, need, pass, &out->dropped)) continue;
            x = add_entry(h, model, pe, p, s.ids[i], bb, need, pass);
            if (x < 0) continue;
            s.copy_ids[nc] = s.ids[i];
            s.copy_ent[nc] = x;
            s.dst[nc++] = h->e[x].kv;
        }
        s.ent[i] = x;
        s.kept[n_kept++] = x;
    }
    if (nc && atlas_model_kv_save(m, s.copy_ids, nc, s.dst) != ATLAS_OK) {
        for (int i = nc - 1; i >= 0; i--) drop(h, s.copy_ent[i]); /* continuations first */
        nc = 0;
    }
    int k = 0;
    for (int i = 0; i < n_kept; i++)
        if (h->e[s.kept[i]].model == model && h->e[s.kept[i]].pass == pass)
            s.kept[k++] = s.kept[i];
    touch(h, s.kept, k);
    out->blocks = (uint64_t)nc;
    out->bytes = (uint64_t)nc * bb;
    free(s.dst);
}

int atlas_kv_host_restore(atlas_kv_host *h, int model, atlas_model *m, atlas_kv_pool *p,
                          atlas_kv_table *t, const int32_t *tokens, int n,
                          atlas_kv_host_moved *out) {
    *out = (atlas_kv_host_moved){0};
    int bs = p->block_size, k = t->n, max = n > 0 ? (n - 1) / bs : 0;
    if (max > t->cap) max = t->cap;
    if (!h || model < 0 || model >= h->n_models || !h->models[model].n || k >= max ||
        t->broken || t->n_reg != k || t->n_written != k ||
        atlas_model_kv_block_bytes(m) != h->models[model].ident.block_bytes)
        return k * bs;
    int32_t *path = malloc((size_t)max * sizeof *path);
    const void **src = malloc((size_t)max * sizeof *src);
    int d = 0;
    for (int32_t x = -1; path && src && d < max; d++) { /* proven from the first block on */
        x = find(h, model, x, t->salt, t->salt_len, tokens + (size_t)d * bs, bs);
        if (x < 0) break;
        path[d] = x;
    }
    int r = d - k, fr = atlas_kv_pool_free(p);
    if (r > fr) r = fr;
    if (r <= 0 || !atlas_kv_table_reserve(p, t, (k + r) * bs)) {
        free(path);
        free(src);
        return k * bs;
    }
    for (int i = 0; i < r; i++) src[i] = h->e[path[k + i]].kv;
    if (atlas_model_kv_restore(m, t->ids + k, r, src) != ATLAS_OK) {
        /* the blocks go back unregistered; the matched ones are taken again */
        atlas_kv_table_release(p, t, tokens, k * bs);
        free(path);
        free(src);
        return atlas_kv_table_match(p, t, tokens, n);
    }
    atlas_kv_table_commit(p, t, tokens, (k + r) * bs, false);
    touch(h, path, k + r);
    out->blocks = (uint64_t)r;
    out->bytes = (uint64_t)r * h->models[model].ident.block_bytes;
    free(path);
    free(src);
    return (k + r) * bs;
}
