/* cli/progress.c — see progress.h. */
#include "cli/progress.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/utf8.h"

enum { BAR_WIDTH = 24, MSG_CAP = 1024 };
static const double BAR_AFTER_S = 0.5, REDRAW_EVERY_S = 0.1;

struct atlas_cli_progress {
    pthread_mutex_t mu; /* report runs on loader threads, begin and end on the caller's */
    FILE *out;
    bool tty, muted, active, drawn, json;
    char name[128];
    double t0, t_drawn;
    uint64_t done, total;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

atlas_cli_progress *atlas_cli_progress_new(FILE *out) {
    atlas_cli_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->out = out;
    p->tty = isatty(fileno(out)) == 1;
    return p;
}

void atlas_cli_progress_free(atlas_cli_progress *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Under p->mu.  The name is made valid UTF-8 (a directory's name may not be), cut before
 * a character that does not fit. */
static void begin_locked(atlas_cli_progress *p, const char *name) {
    if (!name) name = "model";
    atlas_utf8_clean(p->name, sizeof p->name, name, strlen(name));
    p->t0 = now_s();
    p->active = true;
    p->drawn = false;
    p->done = p->total = 0;
}

void atlas_cli_progress_begin(atlas_cli_progress *p, const char *name) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    begin_locked(p, name);
    pthread_mutex_unlock(&p->mu);
}

/* "16.1 GB", "12.6 MB": decimal units, as disks and downloads count. */
static void size_str(char *buf, size_t cap, uint64_t bytes) {
    if (bytes >= 1000000000u) snprintf(buf, cap, "%.1f GB", bytes / 1e9);
    else snprintf(buf, cap, "%.1f MB", bytes / 1e6);
}

/* Under p->mu: the bar, written at once (one write for the whole line). */
static void draw(atlas_cli_progress *p, double t) {
    double el = t - p->t0, frac = p->total ? (double)p->done / (double)p->total : 0;
    if (frac > 1) frac = 1;
    double rate = el > 0 ? p->done / el : 0;
    char bar[BAR_WIDTH + 1], got[32], all[32], eta[32], line[400];
    int fill = (int)(frac * BAR_WIDTH + 0.5);
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '-';
    bar[BAR_WIDTH] = '\0';
    size_str(got, sizeof got, p->done);
    size_str(all, sizeof all, p->total);
    if (rate > 0 && p->total > p->done)
        snprintf(eta, sizeof eta, "ETA %.0f s", (double)(p->total - p->done) / rate + 0.5);
    else
        snprintf(eta, sizeof eta, "ETA -");
    int n = snprintf(line, sizeof line, "\ratlas: loading %s [%s] %3.0f%%  %s / %s  %.1f GB/s  %s\033[K",
                     p->name, bar, frac * 100, got, all, rate / 1e9, eta);
    if (n > 0) fwrite(line, 1, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1, p->out);
    fflush(p->out);
    p->drawn = true;
    p->t_drawn = t;
}

void atlas_cli_progress_report(void *user, const char *model, uint64_t done, uint64_t total) {
    atlas_cli_progress *p = user;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (!p->active) begin_locked(p, model);
    p->done = done;
    p->total = total;
    double t = now_s();
    if (p->tty && !p->muted && !p->json && t - p->t0 >= BAR_AFTER_S &&
        (!p->drawn || t - p->t_drawn >= REDRAW_EVERY_S))
        draw(p, t);
    pthread_mutex_unlock(&p->mu);
}

/* Under p->mu: msg as a line of its own, in the chosen format; made valid UTF-8 first (it
 * quotes names and directories), which json_pack requires and a terminal is owed. */
static void say_locked(atlas_cli_progress *p, const char *raw) {
    char msg[3 * MSG_CAP + 1];
    atlas_utf8_clean(msg, sizeof msg, raw, strlen(raw));
    if (p->drawn) fputs("\r\033[K", p->out); /* the bar's line becomes this one */
    p->drawn = false;
    if (!p->json) {
        fprintf(p->out, "atlas: %s\n", msg);
        fflush(p->out);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    json_t *o = json_pack("{s:s, s:s, s:s}", "time", when, "level", "info", "msg", msg);
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (line) fprintf(p->out, "%s\n", line);
    free(line);
    fflush(p->out);
}

void atlas_cli_progress_say(atlas_cli_progress *p, const char *fmt, ...) {
    if (!p) return;
    char msg[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&p->mu);
    say_locked(p, msg);
    pthread_mutex_unlock(&p->mu);
}

void atlas_cli_progress_json(atlas_cli_progress *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->json = true;
    pthread_mutex_unlock(&p->mu);
}

void atlas_cli_progress_end(atlas_cli_progress *p, int ok, const char *device) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (p->drawn) fputs("\r\033[K", p->out); /* the bar's line is the done line's */
    p->drawn = false;
    if (ok && p->active && !p->muted) {
        double el = now_s() - p->t0;
        char size[32], msg[400];
        size_str(size, sizeof size, p->total);
        snprintf(msg, sizeof msg, "loaded %s: %s in %.*f s (%.1f GB/s), %s", p->name, size,
                 el < 1 ? 2 : 1, el, el > 0 ? p->total / el / 1e9 : 0.0,
                 device && *device ? device : "?");
        say_locked(p, msg);
    }
    fflush(p->out);
    p->active = p->drawn = false;
    pthread_mutex_unlock(&p->mu);
}

void atlas_cli_progress_mute(atlas_cli_progress *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->muted = true;
    pthread_mutex_unlock(&p->mu);
}
