/* cli/startup.c — see startup.h. */
#include "cli/startup.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/host.h"

static double clock_ms(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double atlas_cli_now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

double atlas_cli_process_start_ms(void) {
    double mono = clock_ms(CLOCK_MONOTONIC), boot = clock_ms(CLOCK_BOOTTIME);
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    /* field 22, counted after the command's ")" (the command may hold spaces) */
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    int field = 2;
    for (; p && *p && field < 22; p++)
        if (*p == ' ') field++;
    long hz = sysconf(_SC_CLK_TCK);
    if (!p || field != 22 || sscanf(p, "%llu", &start) != 1 || hz <= 0) return mono;
    double since = boot - (double)start * 1e3 / (double)hz;
    return since >= 0 && since < 60e3 ? mono - since : mono; /* a minute: a clock gone odd */
}

void atlas_cli_startup_note(atlas_cli_startup *su, const atlas_residency_event *ev) {
    if (ev->kind != ATLAS_RESIDENCY_LOADED || !ev->times) return;
    for (int i = 0; i < su->n_models; i++)
        if (!strcmp(su->names[i], ev->model) && !su->loaded[i]) {
            su->load[i] = *ev->times;
            su->loaded[i] = 1;
        }
}

/* ", NAME 0.123 s" onto line when t was reached. */
static void put(char *line, size_t cap, double t0, const char *name, double t) {
    size_t n = strlen(line);
    if (t > 0 && n < cap)
        snprintf(line + n, cap - n, "%s%s %.3f s", n ? ", " : "", name, (t - t0) / 1e3);
}

void atlas_cli_startup_log(const atlas_cli_startup *su, atlas_server *server, double listening) {
    double t0 = su->t0;
    atlas_host_times ht;
    atlas_host_get_times(&ht);
    char line[512] = "";
    put(line, sizeof line, t0, "driver", ht.driver);
    put(line, sizeof line, t0, "cuInit", ht.cuinit);
    put(line, sizeof line, t0, "context", ht.context);
    put(line, sizeof line, t0, "streams", ht.streams);
    put(line, sizeof line, t0, "cuBLASLt", ht.cublaslt);
    put(line, sizeof line, t0, "staging", ht.staging);
    if (line[0]) atlas_server_log(server, ATLAS_LOG_INFO, "start: host: %s", line);
    for (int i = 0; i < su->n_models; i++) {
        const atlas_model_load_times *t = &su->load[i];
        line[0] = '\0';
        if (su->loaded[i]) {
            put(line, sizeof line, t0, "checked", su->checked);
            put(line, sizeof line, t0, "begin", t->begin);
            put(line, sizeof line, t0, "config", t->config);
            put(line, sizeof line, t0, "files", t->files);
            put(line, sizeof line, t0, "backend", t->backend);
            put(line, sizeof line, t0, "weights", t->weights);
            put(line, sizeof line, t0, "kv", t->kv);
            put(line, sizeof line, t0, "ready", t->end);
        }
        put(line, sizeof line, t0, "tokenizer", su->tokenizer[i]);
        if (line[0])
            atlas_server_log(server, ATLAS_LOG_INFO, "start: model %s: %s", su->names[i], line);
    }
    atlas_server_log(server, ATLAS_LOG_INFO, "start: listening %.3f s", (listening - t0) / 1e3);
}
