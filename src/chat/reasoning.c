/* chat/reasoning.c — atlas/reasoning.h: the "<think>" splitter, a small state machine over
 * the bytes held back, releasing what can no longer be part of a tag. */
#include "atlas/reasoning.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
enum { OPEN_LEN = sizeof OPEN - 1, CLOSE_LEN = sizeof CLOSE - 1 };

typedef enum {
    R_START,  /* nothing but whitespace yet: may still open with "<think>" */
    R_LEAD,   /* just inside the block: whitespace is dropped */
    R_INSIDE, /* reasoning text */
    R_AFTER,  /* just after "</think>": whitespace is dropped */
    R_CONTENT /* the rest is content */
} r_state;

struct atlas_reasoning {
    r_state state;
    char *held;
    size_t n, cap;
};

typedef struct out_buf {
    char *p;
    size_t n, cap;
} out_buf;

static bool add(out_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static void drop(atlas_reasoning *r, size_t k) {
    memmove(r->held, r->held + k, r->n - k);
    r->n -= k;
}

atlas_status atlas_reasoning_new(bool inside, atlas_reasoning **out) {
    atlas_reasoning *r = calloc(1, sizeof *r);
    if (r) r->held = malloc(r->cap = 64); /* never NULL: the steps do arithmetic on it */
    if (!r || !r->held) {
        free(r);
        *out = NULL;
        return atlas_fail(ATLAS_ERR_NOMEM, "reasoning parser: out of memory");
    }
    r->state = inside ? R_LEAD : R_START;
    *out = r;
    return ATLAS_OK;
}

void atlas_reasoning_free(atlas_reasoning *r) {
    if (!r) return;
    free(r->held);
    free(r);
}

/* Bytes at the end of held[0, n) to keep in R_INSIDE: a proper prefix of "</think>" and the
 * whitespace before it (dropped if the tag follows). */
static size_t inside_tail(const char *h, size_t n) {
    size_t keep = 0;
    for (size_t k = n < CLOSE_LEN - 1 ? n : CLOSE_LEN - 1; k > 0; k--)
        if (!memcmp(h + n - k, CLOSE, k)) {
            keep = k;
            break;
        }
    while (keep < n && is_ws(h[n - keep - 1])) keep++;
    return keep;
}

/* One step of the machine; false when it must wait for more bytes (or it is done). */
static bool step(atlas_reasoning *r, bool end, out_buf *reason, out_buf *content, bool *nomem) {
    char *h = r->held;
    size_t n = r->n;
    switch (r->state) {
    case R_START: {
        size_t i = 0;
        while (i < n && is_ws(h[i])) i++;
        size_t m = n - i;
        if (m >= OPEN_LEN && !memcmp(h + i, OPEN, OPEN_LEN)) {
            drop(r, i + OPEN_LEN);
            r->state = R_LEAD;
            return true;
        }
        if (!end && m < OPEN_LEN && !memcmp(h + i, OPEN, m)) return false; /* may open */
        r->state = R_CONTENT;
        return true;
    }
    case R_LEAD:
    case R_AFTER: {
        size_t i = 0;
        while (i < n && is_ws(h[i])) i++;
        drop(r, i);
        if (r->n == 0) return false;
        r->state = r->state == R_LEAD ? R_INSIDE : R_CONTENT;
        return true;
    }
    case R_INSIDE: {
        const char *tag = n >= CLOSE_LEN ? memmem(h, n, CLOSE, CLOSE_LEN) : NULL;
        if (tag) {
            size_t k = (size_t)(tag - h), t = k;
            while (t > 0 && is_ws(h[t - 1])) t--;
            if (!add(reason, h, t)) return *nomem = true, false;
            drop(r, k + CLOSE_LEN);
            r->state = R_AFTER;
            return true;
        }
        size_t keep = end ? 0 : inside_tail(h, n);
        size_t emit = n - keep;
        if (end)
            while (emit > 0 && is_ws(h[emit - 1])) emit--; /* never closed: trim it anyway */
        if (!add(reason, h, emit)) return *nomem = true, false;
        drop(r, end ? n : emit);
        return false;
    }
    case R_CONTENT:
        if (!add(content, h, n)) return *nomem = true, false;
        r->n = 0;
        return false;
    }
    return false;
}

atlas_status atlas_reasoning_feed(atlas_reasoning *r, const char *piece, size_t len, bool end,
                                  char **reasoning, char **content) {
    *reasoning = *content = NULL;
    if (r->n + len > r->cap) {
        size_t cap = r->cap ? r->cap : 64;
        while (cap < r->n + len) cap *= 2;
        char *p = realloc(r->held, cap);
        if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "reasoning parser: out of memory");
        r->held = p, r->cap = cap;
    }
    if (len) memcpy(r->held + r->n, piece, len);
    r->n += len;
    out_buf a = {0}, b = {0};
    bool nomem = !add(&a, "", 0) || !add(&b, "", 0);
    while (!nomem && step(r, end, &a, &b, &nomem)) {
    }
    if (!nomem && end && r->n) /* R_START/R_LEAD/R_AFTER whitespace left at the end */
        r->n = 0;
    if (nomem) {
        free(a.p);
        free(b.p);
        return atlas_fail(ATLAS_ERR_NOMEM, "reasoning parser: out of memory");
    }
    *reasoning = a.p;
    *content = b.p;
    return ATLAS_OK;
}

bool atlas_reasoning_template_thinks(const char *template_source) {
    return template_source && strstr(template_source, OPEN) != NULL;
}

bool atlas_reasoning_prompt_open(const char *prompt) {
    size_t n = prompt ? strlen(prompt) : 0;
    while (n > 0 && is_ws(prompt[n - 1])) n--;
    return n >= OPEN_LEN && !memcmp(prompt + n - OPEN_LEN, OPEN, OPEN_LEN);
}
