/* cli/options.c — unknown options named, with the nearest valid one; the spellings of other
 * tools accepted where they mean the same (cli/options.h). */
#include "cli/options.h"

#include <stdio.h>
#include <string.h>

int atlas_cli_known_option(const char *arg, const char *const *valid) {
    for (; *valid; valid++)
        if (!strcmp(arg, *valid)) return 1;
    return 0;
}

/* Spellings of llama.cpp, Ollama, vLLM and transformers that mean what an atlas option
 * means: each stands for the first of its options that the command has. */
static const struct {
    const char *spelling;
    const char *means[3];
} aliases[] = {
    {"--max-tokens", {"-n"}},
    {"--n-predict", {"-n", "--max-tokens"}},
    {"--predict", {"-n", "--max-tokens"}},
    {"--num-predict", {"-n", "--max-tokens"}},
    {"--max-new-tokens", {"-n", "--max-tokens"}},
    {"--temperature", {"--temp"}},
    {"--prompt-file", {"--file"}},
    {"-c", {"--ctx-size"}},
    {"--ctx", {"--ctx-size"}},
    {"--n-ctx", {"--ctx-size"}},
    {"--num-ctx", {"--ctx-size"}},
    {"--context-size", {"--ctx-size"}},
    {"--context-length", {"--ctx-size"}},
    {"-t", {"--threads"}},
    {"--n-threads", {"--threads"}},
    {"--num-threads", {"--threads"}},
    {"-s", {"--seed"}},
    {"--random-seed", {"--seed"}},
    {"--model-path", {"--model", "-m"}},
    {"--model", {"-m"}},
    {"--system-prompt", {"--system"}},
    {"-tp", {"--tensor-parallel"}},
    {"--tensor-parallel-size", {"--tensor-parallel"}},
    {"-np", {"--parallel"}},
    {"--n-parallel", {"--parallel"}},
    {"--max-num-seqs", {"--parallel"}},
    {"-b", {"--batch-tokens"}},
    {"--batch-size", {"--batch-tokens"}},
    {"--max-num-batched-tokens", {"--batch-tokens"}},
    {"--api_key", {"--api-key"}},
};

/* Spellings that mean something atlas does differently: answered with what it does. cmd:
 * the one command they are for (NULL: any that has option). */
static const struct {
    const char *spelling, *cmd, *option, *text;
} hints[] = {
    {"--n-gpu-layers", NULL, "--device", "atlas puts the whole model on one device: --device cuda"},
    {"-ngl", NULL, "--device", "atlas puts the whole model on one device: --device cuda"},
    {"--gpu-layers", NULL, "--device", "atlas puts the whole model on one device: --device cuda"},
    {"--gpu", NULL, "--device", "did you mean '--device cuda'?"},
    {"--cuda", NULL, "--device", "did you mean '--device cuda'?"},
    {"--cpu", NULL, "--device", "did you mean '--device cpu'?"},
    {"-i", "run", NULL, "atlas chat talks with a model, a turn at a time"},
    {"--interactive", "run", NULL, "atlas chat talks with a model, a turn at a time"},
    {"-cnv", "run", NULL, "atlas chat talks with a model, a turn at a time"},
    {"--conversation", "run", NULL, "atlas chat talks with a model, a turn at a time"},
    {"--served-model-name", NULL, "--model", "--model NAME=DIR serves DIR under the name NAME"},
    {"--model-dir", "serve", NULL,
     "--model DIR serves one model, --models-dir ROOT every subdirectory of ROOT"},
};

/* "--max_tokens" is "--max-tokens": a Python tool's spelling, into buf. */
static const char *dashed(const char *arg, char *buf, size_t cap) {
    if (strncmp(arg, "--", 2) || !strchr(arg, '_') || strlen(arg) >= cap) return arg;
    for (size_t i = 0;; i++) {
        buf[i] = arg[i] == '_' ? '-' : arg[i];
        if (!arg[i]) return buf;
    }
}

/* valid's own copy of name, or NULL when the command has no such option. */
static const char *find(const char *name, const char *const *valid) {
    for (; *valid; valid++)
        if (!strcmp(name, *valid)) return *valid;
    return NULL;
}

const char *atlas_cli_resolve_option(const char *arg, const char *const *valid) {
    if (find(arg, valid)) return arg;
    char buf[64];
    const char *d = dashed(arg, buf, sizeof buf), *own = find(d, valid);
    if (own) return own;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(d, aliases[i].spelling)) continue;
        for (int k = 0; k < 3 && aliases[i].means[k]; k++)
            if ((own = find(aliases[i].means[k], valid))) return own;
    }
    return arg;
}

/* Levenshtein distance; strings longer than 63 bytes are far from every option anyway. */
static int distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 63 || nb > 63) return 1 << 20;
    int row[64];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb];
}

const char *atlas_cli_nearest_option(const char *arg, const char *const *valid) {
    const char *best = NULL;
    int best_d = 1 << 20;
    for (; *valid; valid++) {
        int d = distance(arg, *valid);
        if (d < best_d) best_d = d, best = *valid;
    }
    size_t len = strlen(arg);
    return best && best_d * 3 <= (int)(len > 3 ? len : 3) ? best : NULL;
}

int atlas_cli_unknown_option(const char *cmd, const char *arg, const char *const *valid) {
    char buf[64];
    const char *d = dashed(arg, buf, sizeof buf);
    for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++) {
        if (strcmp(d, hints[i].spelling) || (hints[i].cmd && strcmp(cmd, hints[i].cmd)) ||
            (hints[i].option && !find(hints[i].option, valid)))
            continue;
        fprintf(stderr, "atlas %s: unknown option '%s': %s\n", cmd, arg, hints[i].text);
        return 2;
    }
    const char *near = atlas_cli_nearest_option(d, valid);
    /* a typo of another tool's spelling (--temprature): the option that spelling means */
    int best = near ? distance(d, near) : 1 << 20;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        const char *own = NULL;
        for (int k = 0; k < 3 && aliases[i].means[k] && !own; k++)
            own = find(aliases[i].means[k], valid);
        int dist = own ? distance(d, aliases[i].spelling) : 1 << 20;
        size_t len = strlen(d);
        if (dist < best && dist * 3 <= (int)(len > 3 ? len : 3)) best = dist, near = own;
    }
    if (near)
        fprintf(stderr, "atlas %s: unknown option '%s'; did you mean '%s'?\n", cmd, arg, near);
    else
        fprintf(stderr, "atlas %s: unknown option '%s' (see --help)\n", cmd, arg);
    return 2;
}
