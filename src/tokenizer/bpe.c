/* tokenizer/bpe.c — hash maps for the vocabulary and merge ranks, the per-call encoding
 * state, and the BPE merge of one word, with the word cache shared by all threads.
 *
 * The merge loop is Hugging Face's Word::merge_all: a min-heap of candidate pairs ordered
 * by (rank, position), entries checked for staleness when popped, symbols in a linked list.
 * Matching its tie-breaking (lowest rank, then leftmost) is what makes the ids identical. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

/* ---- hashing ----------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

uint64_t tok_hash_bytes(const void *p, size_t len) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (len * 0xff51afd7ed558ccdULL);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9fb21c651e98df25ULL;
        h ^= h >> 29;
        s += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, len);
    return mix64(h ^ w);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- bytes -> id -------------------------------------------------------------------------- */

atlas_status tok_strmap_init(tok_strmap *m, size_t expected) {
    m->n = 0;
    m->cap = pow2_at_least(expected + expected / 2 + 1); /* load factor below 2/3 */
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: hash map of %zu entries", expected);
    return ATLAS_OK;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* The slot holding key, or the empty slot where it would go. */
static tok_strmap_slot *strmap_find(const tok_strmap *m, const char *key, size_t len) {
    size_t mask = m->cap - 1;
    for (size_t i = tok_hash_bytes(key, len) & mask;; i = (i + 1) & mask) {
        tok_strmap_slot *sl = &m->slots[i];
        if (!sl->key || (sl->len == len && memcmp(sl->key, key, len) == 0)) return sl;
    }
}

static atlas_status strmap_grow(tok_strmap *m) {
    tok_strmap old = *m;
    ATLAS_TRY(tok_strmap_init(m, old.cap)); /* about twice the entries */
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].key) *strmap_find(m, old.slots[i].key, old.slots[i].len) = old.slots[i];
    m->n = old.n;
    free(old.slots);
    return ATLAS_OK;
}

atlas_status tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 3 > m->cap * 2) ATLAS_TRY(strmap_grow(m));
    tok_strmap_slot *sl = strmap_find(m, key, len);
    if (!sl->key) m->n++;
    *sl = (tok_strmap_slot){key, (uint32_t)len, val};
    return ATLAS_OK;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    const tok_strmap_slot *sl = strmap_find(m, key, len);
    return sl->key ? sl->val : -1;
}

/* ---- (left, right) -> (rank, id) ---------------------------------------------------------- */

atlas_status tok_mergemap_init(tok_mergemap *m, size_t expected) {
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: merge map of %zu", expected);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = UINT64_MAX;
    return ATLAS_OK;
}

void tok_mergemap_free(tok_mergemap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static inline uint64_t merge_key(int32_t l, int32_t r) {
    return (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
}

/* The map is sized for all merges up front (init), so it never grows. */
void tok_mergemap_put(tok_mergemap *m, int32_t left, int32_t right, uint32_t rank, int32_t id) {
    uint64_t k = merge_key(left, right);
    size_t mask = m->cap - 1;
    size_t i = mix64(k) & mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != k) i = (i + 1) & mask;
    if (m->slots[i].key == UINT64_MAX) m->n++;
    /* a repeated pair keeps the later rank, as HF's HashMap collect does */
    m->slots[i] = (tok_merge){k, rank, id};
}

const tok_merge *tok_mergemap_get(const tok_mergemap *m, int32_t left, int32_t right) {
    uint64_t k = merge_key(left, right);
    size_t mask = m->cap - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
        if (m->slots[i].key == k) return &m->slots[i];
        if (m->slots[i].key == UINT64_MAX) return NULL;
    }
}

/* ---- per-call state ------------------------------------------------------------------------ */
/* Here, at the bottom of the pipeline, because BPE is what appends the ids: pretok.c and
 * encode.c above use it and nothing here calls back up. */

void tok_ctx_init(tok_ctx *c, const atlas_tokenizer *tok) {
    memset(c, 0, sizeof *c);
    c->tok = tok;
}

void tok_ctx_free(tok_ctx *c) {
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    pcre2_jit_stack_free(c->jit_stack);
    free(c->syms);
    free(c->heap);
}

atlas_status tok_ctx_push_id(tok_ctx *c, int32_t id) {
    if (c->n_ids == c->cap_ids) {
        size_t cap = c->cap_ids ? c->cap_ids * 2 : 64;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: %zu ids", cap);
        c->ids = p;
        c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = id;
    return ATLAS_OK;
}

/* ---- the merge loop ------------------------------------------------------------------------ */

struct tok_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t len;       /* bytes covered; 0 once merged into its left neighbour */
};

struct tok_heap_item {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
};

static inline bool heap_less(const struct tok_heap_item *a, const struct tok_heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct tok_heap_item *h, size_t *n, struct tok_heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static struct tok_heap_item heap_pop(struct tok_heap_item *h, size_t *n) {
    struct tok_heap_item top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

static atlas_status ensure_scratch(tok_ctx *c, size_t n) {
    if (n <= c->cap_syms) return ATLAS_OK;
    size_t cap = n < 64 ? 64 : n * 2;
    struct tok_sym *s = realloc(c->syms, cap * sizeof *s);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: BPE scratch for a %zu-byte word", n);
    c->syms = s;
    /* each merge pushes at most 2 entries: n - 1 initial + 2 (n - 1) */
    struct tok_heap_item *h = realloc(c->heap, 3 * cap * sizeof *h);
    if (!h) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: BPE scratch for a %zu-byte word", n);
    c->heap = h;
    c->cap_syms = cap;
    c->cap_heap = 3 * cap;
    return ATLAS_OK;
}

static void try_pair(const tok_mergemap *mm, struct tok_heap_item *h, size_t *nh,
                     const struct tok_sym *s, int32_t pos) {
    const tok_merge *m = tok_mergemap_get(mm, s[pos].id, s[s[pos].next].id);
    if (m) heap_push(h, nh, (struct tok_heap_item){m->rank, (uint32_t)pos, m->id});
}

/* A SentencePiece-style word's first symbols, as HF's BPE::merge_word: each character's
 * token; for a character without one, its bytes' <0xNN> tokens when all exist
 * (byte_fallback), else the unknown token, fused with an unknown just before it (fuse_unk);
 * with no unknown token the character is dropped.  Returns the count (at most len). */
static size_t spm_symbols(const atlas_tokenizer *tok, struct tok_sym *s, const unsigned char *w,
                          size_t len) {
    size_t n = 0;
    bool prev_unk = false;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int r = tok_utf8_next(w + i, len - i, &cp);
        size_t cl = r > 0 ? (size_t)r : 1; /* encode validated the text: r > 0 */
        int32_t id = tok_strmap_get(&tok->by_str, (const char *)w + i, cl);
        bool fell = false;
        if (id < 0 && tok->byte_fallback) {
            fell = true;
            for (size_t b = 0; b < cl; b++) fell &= tok->fallback_id[w[i + b]] >= 0;
            for (size_t b = 0; fell && b < cl; b++, n++)
                s[n] = (struct tok_sym){tok->fallback_id[w[i + b]], (int32_t)n - 1, (int32_t)n + 1, 1};
        }
        if (id >= 0) {
            s[n] = (struct tok_sym){id, (int32_t)n - 1, (int32_t)n + 1, (uint32_t)cl};
            n++;
        } else if (!fell && tok->unk_id >= 0) {
            if (prev_unk && tok->fuse_unk) {
                s[n - 1].len += (uint32_t)cl;
            } else {
                s[n] = (struct tok_sym){tok->unk_id, (int32_t)n - 1, (int32_t)n + 1, (uint32_t)cl};
                n++;
            }
        }
        prev_unk = id < 0 && !fell && tok->unk_id >= 0;
        i += cl;
    }
    return n;
}

/* Merges the symbols of word and appends the resulting ids (c->ids). */
static atlas_status bpe_merge(tok_ctx *c, const unsigned char *word, size_t len) {
    const atlas_tokenizer *tok = c->tok;
    ATLAS_TRY(ensure_scratch(c, len));
    struct tok_sym *s = c->syms;
    size_t n = tok->spm ? spm_symbols(tok, s, word, len) : 0;
    for (size_t i = 0; !tok->spm && i < len; i++) {
        int32_t id = tok->byte_id[word[i]];
        if (id < 0) continue; /* no token for this byte and no unk: HF drops it */
        s[n] = (struct tok_sym){id, (int32_t)n - 1, (int32_t)n + 1, 1};
        n++;
    }
    if (n == 0) return ATLAS_OK;
    s[n - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(&tok->merges, c->heap, &nh, s, (int32_t)i);
    while (nh) {
        struct tok_heap_item top = heap_pop(c->heap, &nh);
        struct tok_sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t right = cur->next;
        const tok_merge *m = tok_mergemap_get(&tok->merges, cur->id, s[right].id);
        if (!m || m->id != top.id) continue; /* stale entry */
        cur->id = top.id;
        cur->len += s[right].len;
        cur->next = s[right].next;
        s[right].len = 0;
        if (cur->next >= 0) s[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) try_pair(&tok->merges, c->heap, &nh, s, cur->prev);
        if (cur->next >= 0) try_pair(&tok->merges, c->heap, &nh, s, (int32_t)top.pos);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) ATLAS_TRY(tok_ctx_push_id(c, s[i].id));
    return ATLAS_OK;
}

/* ---- the word cache ------------------------------------------------------------------------ */

/* The payload as plain bytes: [0] key_len, [1] n_ids, [2..24) key, [24..56) ids. */
typedef union wc_payload {
    uint64_t w[TOK_WCACHE_WORDS];
    unsigned char b[TOK_WCACHE_WORDS * 8];
} wc_payload;

static bool cache_read(tok_wcache_slot *sl, wc_payload *out) {
    uint64_t s1 = atomic_load_explicit(&sl->seq, memory_order_acquire);
    if (s1 & 1) return false;
    for (int i = 0; i < TOK_WCACHE_WORDS; i++)
        out->w[i] = atomic_load_explicit(&sl->data[i], memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&sl->seq, memory_order_relaxed) == s1;
}

static void cache_write(tok_wcache_slot *sl, const wc_payload *in) {
    uint64_t s = atomic_load_explicit(&sl->seq, memory_order_relaxed);
    if ((s & 1) || !atomic_compare_exchange_strong_explicit(&sl->seq, &s, s + 1,
                                                            memory_order_relaxed,
                                                            memory_order_relaxed))
        return; /* another writer is here: skip, the word is cached next time */
    atomic_thread_fence(memory_order_release);
    for (int i = 0; i < TOK_WCACHE_WORDS; i++)
        atomic_store_explicit(&sl->data[i], in->w[i], memory_order_relaxed);
    atomic_store_explicit(&sl->seq, s + 2, memory_order_release);
}

atlas_status tok_bpe_word(tok_ctx *c, const char *word, size_t len) {
    const atlas_tokenizer *tok = c->tok;
    if (len == 0) return ATLAS_OK;
    if (len == 1 && tok->byte_id[(unsigned char)word[0]] >= 0)
        return tok_ctx_push_id(c, tok->byte_id[(unsigned char)word[0]]);
    /* the cache first: a hit costs one cache line, the vocab lookup two or more */
    tok_wcache_slot *sl = NULL;
    wc_payload pl;
    if (len <= TOK_WCACHE_KEY && tok->wcache) {
        sl = &tok->wcache[tok_hash_bytes(word, len) & (TOK_WCACHE_SLOTS - 1)];
        if (cache_read(sl, &pl) && pl.b[0] == len && !memcmp(pl.b + 2, word, len)) {
            for (size_t i = 0; i < pl.b[1]; i++) {
                int32_t id;
                memcpy(&id, pl.b + 24 + 4 * i, 4);
                ATLAS_TRY(tok_ctx_push_id(c, id));
            }
            return ATLAS_OK;
        }
    }
    size_t first = c->n_ids;
    int32_t whole = !tok->ignore_merges ? -1
                    : tok_strmap_get(tok->spm ? &tok->by_str : &tok->by_bytes, word, len);
    if (whole >= 0) ATLAS_TRY(tok_ctx_push_id(c, whole)); /* a word in the vocab is one token */
    else ATLAS_TRY(bpe_merge(c, (const unsigned char *)word, len));
    size_t n = c->n_ids - first;
    if (sl && n <= TOK_WCACHE_IDS) {
        memset(&pl, 0, sizeof pl);
        pl.b[0] = (unsigned char)len;
        pl.b[1] = (unsigned char)n;
        memcpy(pl.b + 2, word, len);
        if (n) memcpy(pl.b + 24, c->ids + first, n * sizeof(int32_t)); /* ids is NULL when empty */
        cache_write(sl, &pl);
    }
    return ATLAS_OK;
}

/* ---- the added-token trie ----------------------------------------------------------------- */

atlas_status tok_trie_add(tok_trie *t, const char *s, size_t len, int32_t added_index) {
    if (len == 0) return ATLAS_OK; /* an empty token never matches */
    if (!t->nodes) {
        t->cap = 64;
        t->nodes = malloc(t->cap * sizeof *t->nodes);
        if (!t->nodes) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: added-token trie");
        t->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
        t->n = 1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t ch = t->nodes[node].first_child;
        while (ch >= 0 && t->nodes[ch].byte != b) ch = t->nodes[ch].next_sibling;
        if (ch < 0) {
            if (t->n == t->cap) {
                tok_trie_node *nn = realloc(t->nodes, 2 * t->cap * sizeof *nn);
                if (!nn) return atlas_fail(ATLAS_ERR_NOMEM, "tokenizer: added-token trie");
                t->nodes = nn;
                t->cap *= 2;
            }
            ch = (int32_t)t->n++;
            t->nodes[ch] = (tok_trie_node){-1, t->nodes[node].first_child, -1, b};
            t->nodes[node].first_child = ch;
        }
        node = ch;
    }
    if (t->nodes[node].added < 0) t->nodes[node].added = added_index; /* first one wins */
    t->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    return ATLAS_OK;
}

void tok_trie_free(tok_trie *t) {
    free(t->nodes);
    memset(t, 0, sizeof *t);
}
