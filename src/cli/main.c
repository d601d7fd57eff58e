/* cli/main.c — `atlas <command> ...`: dispatch to the subcommands, one file each in cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", atlas_cli_run, "generate text from a prompt"},
    {"serve", atlas_cli_serve, "OpenAI-compatible HTTP server"},
    {"bench", atlas_cli_bench, "measure prefill/decode speed against the device's limits"},
    {"tokenize", atlas_cli_tokenize, "print the token ids of a text"},
    {"template", atlas_cli_template, "render a chat template"},
    {"info", atlas_cli_info, "describe a model and the backend that would run it"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: atlas <command> [options]   (atlas <command> --help for each)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
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
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "atlas: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
