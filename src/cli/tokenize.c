/* cli/tokenize.c — `atlas tokenize -m DIR [--add-special] TEXT|-`: prints the token ids of
 * TEXT (or of stdin with "-") as a JSON array. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/tokenizer.h"
#include "cli/cli.h"
#include "cli/options.h"

static const char *const tokenize_options[] = {"-h", "--help", "-m", "--model", "--add-special",
                                               NULL};

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas tokenize [-m DIR] [--add-special] TEXT|-\n"
            "  Prints the token ids of TEXT as a JSON array; '-' reads the text from stdin.\n"
            "  -m, --model DIR   model directory with tokenizer.json (default %s)\n"
            "  --add-special     add the post-processor's special tokens (BOS/EOS)\n"
            "  -h, --help        this help\n",
            atlas_cli_default_model());
}

static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, stdin);
        if (n < cap) break;
        char *b = realloc(buf, cap * 2);
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    if (!buf || ferror(stdin)) {
        free(buf);
        fprintf(stderr, "atlas tokenize: reading stdin failed\n");
        return 1;
    }
    *out = buf;
    *len = n;
    return 0;
}

int atlas_cli_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    bool add_special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = atlas_cli_resolve_option(argv[i], tokenize_options);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i == argc) {
                fprintf(stderr, "atlas tokenize: %s needs a directory\n", a);
                return 2;
            }
            dir = argv[i];
        } else if (!strcmp(a, "--add-special")) {
            add_special = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            return atlas_cli_unknown_option("tokenize", a, tokenize_options);
        } else if (text) {
            fprintf(stderr, "atlas tokenize: one TEXT only (quote it) (see --help)\n");
            return 2;
        } else {
            text = a;
        }
    }
    if (!text) {
        fprintf(stderr, "atlas tokenize: missing TEXT (or '-' for stdin) (see --help)\n");
        return 2;
    }
    if (!dir) dir = atlas_cli_default_model();
    char *buf = NULL;
    size_t len = strlen(text);
    if (!strcmp(text, "-")) {
        if (read_stdin(&buf, &len)) return 1;
        text = buf;
    }
    atlas_tokenizer *tok;
    atlas_status st = atlas_tokenizer_load(dir, &tok);
    if (st != ATLAS_OK) {
        fprintf(stderr, "atlas tokenize: %s\n", atlas_last_error());
        free(buf);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    st = atlas_tokenizer_encode(tok, text, len, add_special, &ids, &n);
    free(buf);
    atlas_tokenizer_free(tok);
    if (st != ATLAS_OK) {
        fprintf(stderr, "atlas tokenize: %s\n", atlas_last_error());
        return 1;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    free(ids);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "atlas tokenize: writing stdout failed\n");
        return 1;
    }
    return 0;
}
