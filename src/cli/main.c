/* cli/main.c — `atlas <command> ...`: dispatch to the subcommands, one file each in cli/. */
#include <stdio.h>
#include <string.h>

#include "atlas/host.h"
#include "atlas/version.h"
#include "cli/cli.h"

#ifndef ATLAS_GIT_COMMIT
#define ATLAS_GIT_COMMIT "unknown"
#endif
#ifndef ATLAS_GPU_TARGETS
#define ATLAS_GPU_TARGETS "unknown"
#endif

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", atlas_cli_run, "generate text from a prompt"},
    {"chat", atlas_cli_chat, "talk with a model in the terminal (in process or --url)"},
    {"serve", atlas_cli_serve, "OpenAI-compatible HTTP server"},
    {"bench", atlas_cli_bench, "measure prefill/decode speed against the device's limits"},
    {"tokenize", atlas_cli_tokenize, "print the token ids of a text"},
    {"template", atlas_cli_template, "render a chat template"},
    {"info", atlas_cli_info, "describe a model and the backend that would run it"},
    {"export", atlas_cli_export, "write the embedded default model into a directory"},
};

/* What a bug report needs: which atlas, built from what, for which GPUs, and whether this
 * machine's CUDA driver and GPU are usable (and why not). */
static int version(void) {
    printf("atlas %s (commit %s)\n", atlas_version(), ATLAS_GIT_COMMIT);
    printf("gpu targets: %s\n", ATLAS_GPU_TARGETS);
    atlas_host *h = NULL;
    if (atlas_host_get(0, &h) == ATLAS_OK) {
        const atlas_host_props *p = atlas_host_properties(h);
        printf("cuda: found: %s (compute %d.%d), driver CUDA %d.%d\n", p->name, p->cc_major,
               p->cc_minor, p->driver_version / 1000, p->driver_version % 1000 / 10);
    } else {
        printf("cuda: not found (%s)\n", atlas_host_unavailable_reason());
    }
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: atlas <command> [options]   (atlas <command> --help for each)\n"
               "       atlas --version   (version, commit, GPU targets, whether CUDA is usable)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

/* What other tools call their commands, when atlas has one that does the same, or says how
 * it is done instead. */
static const struct {
    const char *name, *text;
} command_hints[] = {
    {"pull", "atlas downloads no model: `huggingface-cli download ORG/NAME --local-dir DIR`, "
             "then atlas run -m DIR"},
    {"download", "atlas downloads no model: `huggingface-cli download ORG/NAME --local-dir DIR`, "
                 "then atlas run -m DIR"},
    {"generate", "did you mean 'run'?"},
    {"complete", "did you mean 'run'?"},
    {"show", "did you mean 'info'?"},
};

/* An unknown command: the nearest one (`atlas runn`: run), or what does the job. */
static int unknown_command(const char *cmd) {
    for (size_t i = 0; i < sizeof command_hints / sizeof command_hints[0]; i++)
        if (!strcmp(cmd, command_hints[i].name)) {
            fprintf(stderr, "atlas: unknown command '%s': %s\n", cmd, command_hints[i].text);
            return 2;
        }
    enum { N = sizeof commands / sizeof commands[0] };
    const char *names[N + 1];
    for (size_t i = 0; i < N; i++) names[i] = commands[i].name;
    names[N] = NULL;
    const char *near = cmd[0] != '-' ? atlas_cli_nearest_option(cmd, names) : NULL;
    if (near) {
        fprintf(stderr, "atlas: unknown command '%s'; did you mean '%s'?\n", cmd, near);
        return 2;
    }
    fprintf(stderr, "atlas: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version"))
        return version();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    return unknown_command(argv[1]);
}
