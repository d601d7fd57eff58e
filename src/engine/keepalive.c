/* engine/keepalive.c — keep-alive as Ollama means it: parsing a value, and setting a
 * model's from outside a request.  The release of an idle model is the scheduler's
 * (residency.c, atlas_engine_do_keep_alive). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine_internal.h"

/* The milliseconds of one unit of a Go duration at s, its length in *n; 0: none. */
static double unit_ms(const char *s, size_t *n) {
    static const struct { const char *u; double ms; } units[] = {
        {"ns", 1e-6}, {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"ms", 1}, {"s", 1e3}, {"m", 6e4},
        {"h", 3.6e6}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        size_t k = strlen(units[i].u);
        if (!strncmp(s, units[i].u, k)) return *n = k, units[i].ms;
    }
    return *n = 0, 0;
}

/* Seconds or a sum of number-unit pairs, signed as a whole: "-1", "1.5", "5m", "1h30m". */
static int parse_ms(const char *text, double *out) {
    const char *p = text;
    int neg = *p == '-';
    if (*p == '-' || *p == '+') p++;
    if (!*p) return -1;
    char *end;
    double x = strtod(p, &end);
    if (end != p && !*end && isfinite(x) && *p != '-' && *p != '+') /* a bare number: seconds */
        return *out = (neg ? -x : x) * 1e3, 0;
    double total = 0;
    while (*p) {
        if (*p == '-' || *p == '+' || *p == ' ') return -1;
        x = strtod(p, &end);
        size_t n;
        double ms = end == p || !isfinite(x) ? 0 : unit_ms(end, &n);
        if (ms == 0) return -1;
        total += x * ms;
        p = end + n;
    }
    *out = neg ? -total : total;
    return 0;
}

static atlas_status from_ms(double ms, int64_t *out) {
    if (ms < 0) *out = ATLAS_KEEP_ALIVE_FOREVER;
    else if (ms < 0.5) *out = ATLAS_KEEP_ALIVE_NONE;
    else if (ms > 1e15) *out = ATLAS_KEEP_ALIVE_FOREVER; /* past any server's life */
    else *out = (int64_t)(ms + 0.5);
    return ATLAS_OK;
}

atlas_status atlas_engine_parse_keep_alive(const char *text, int64_t *out_ms) {
    double ms;
    if (!text || parse_ms(text, &ms) != 0 || isnan(ms))
        return atlas_fail(ATLAS_ERR_INVALID, "keep-alive '%.40s': not a number of seconds nor "
                          "a duration such as \"5m\" or \"1h30m\"", text ? text : "");
    return from_ms(ms, out_ms);
}

atlas_status atlas_engine_keep_alive(atlas_engine *e, const char *name, int64_t keep_alive_ms) {
    if (keep_alive_ms < ATLAS_KEEP_ALIVE_NONE)
        return atlas_fail(ATLAS_ERR_INVALID, "keep-alive %lld: out of range",
                          (long long)keep_alive_ms);
    for (int i = 0; name && i < e->n_models; i++) {
        eng_model *md = &e->models[i];
        if (strcmp(md->name, name)) continue;
        pthread_mutex_lock(&e->mu);
        md->keep_now_ms = keep_alive_ms ? keep_alive_ms : md->keep_ms;
        if (md->idle_since > 0) md->idle_since = atlas_engine_now(); /* counts from now */
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mu);
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_NOT_FOUND, "model '%s' is not configured", name ? name : "");
}
