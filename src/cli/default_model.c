/* cli/default_model.c — where the subcommands find a model when no -m is given: models/default,
 * embedded in the binary and registered as an in-memory directory, so that an installed or
 * copied atlas runs with nothing else on disk; and `atlas export`, which writes it out for
 * programs that load a directory.  A file of its own so that the subcommands never call back
 * into main.c's dispatcher. */
#include "cli/default_model.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

static void register_embedded(void) {
    size_t n;
    const atlas_memdir_file *files = atlas_cli_embedded_files(&n);
    if (atlas_memdir_add(ATLAS_CLI_DEFAULT_MODEL_DIR, files, n) != ATLAS_OK)
        fprintf(stderr, "atlas: the embedded model: %s\n", atlas_last_error());
}

const char *atlas_cli_default_model(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_embedded);
    return ATLAS_CLI_DEFAULT_MODEL_DIR;
}

bool atlas_cli_is_default_model(const char *dir) {
    return dir && !strcmp(dir, ATLAS_CLI_DEFAULT_MODEL_DIR);
}

json_t *atlas_cli_model_json(const char *dir, const char *name) {
    if (!atlas_cli_is_default_model(dir)) {
        char path[4096];
        int len = snprintf(path, sizeof path, "%s/%s", dir, name);
        return len > 0 && (size_t)len < sizeof path ? json_load_file(path, 0, NULL) : NULL;
    }
    size_t n;
    const atlas_memdir_file *files = atlas_cli_embedded_files(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(files[i].name, name)) return json_loadb(files[i].data, files[i].size, 0, NULL);
    return NULL;
}

/* The file export writes first into a directory it fills: its mark, so that a later export
 * replaces what an earlier one wrote, and never a directory of the user's that happens to
 * hold a config.json. */
static const char MARK[] = ".atlas-export";
static const char MARK_TEXT[] =
    "Written by `atlas export`: the default model embedded in atlas. Running atlas export\n"
    "on this directory again replaces the files it wrote; other files are left alone.\n";

static int join(char *path, size_t cap, const char *dir, const char *name) {
    int len = snprintf(path, cap, "%s/%s", dir, name);
    if (len >= 0 && (size_t)len < cap) return 0;
    fprintf(stderr, "atlas export: %s/%s: path too long\n", dir, name);
    return 1;
}

/* Writes data to dir/name through a temporary file renamed over it, so that the file is
 * either the old one or the whole new one, whoever reads it meanwhile. */
static int write_file(const char *dir, const char *name, const void *data, size_t size) {
    char path[4096], tmp[4200];
    if (join(path, sizeof path, dir, name)) return 1;
    snprintf(tmp, sizeof tmp, "%s.export-%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "atlas export: %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    const char *p = data;
    size_t left = size;
    int rc = 0;
    while (left > 0 && !rc) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "atlas export: writing %s: %s\n", tmp,
                    w < 0 ? strerror(errno) : "nothing written");
            rc = 1;
        } else {
            p += w, left -= (size_t)w;
        }
    }
    if (close(fd) != 0 && !rc) {
        fprintf(stderr, "atlas export: closing %s: %s\n", tmp, strerror(errno));
        rc = 1;
    }
    if (!rc && rename(tmp, path) != 0) {
        fprintf(stderr, "atlas export: renaming %s to %s: %s\n", tmp, path, strerror(errno));
        rc = 1;
    }
    if (rc) unlink(tmp);
    return rc;
}

/* 0 when export may write into dir: it is its own earlier output (the mark is there), or
 * none of the files it writes is there; else 1, having said which file is the user's. */
static int may_write(const char *dir, const atlas_memdir_file *files, size_t n) {
    char path[4096];
    struct stat st;
    if (join(path, sizeof path, dir, MARK)) return 1;
    if (lstat(path, &st) == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        if (join(path, sizeof path, dir, files[i].name)) return 1;
        if (lstat(path, &st) == 0) {
            fprintf(stderr, "atlas export: %s exists and %s was not written by atlas export "
                    "(no %s): not overwritten; export into a new directory, or remove it\n",
                    path, dir, MARK);
            return 1;
        }
    }
    return 0;
}

static void export_usage(FILE *f) {
    fprintf(f, "usage: atlas export DIR\n"
               "  Writes the default model that is embedded in atlas (%s) into DIR, made if\n"
               "  missing, for programs that load a model directory (examples/embed.c).\n"
               "  DIR is marked as atlas export's (%s): exporting into it again replaces\n"
               "  the files it wrote. Files of a directory it did not write are never\n"
               "  overwritten, and other files in DIR are left alone.\n"
               "  -h, --help   this help\n",
            ATLAS_CLI_DEFAULT_MODEL_DIR, MARK);
}

int atlas_cli_export(int argc, char **argv) {
    static const char *const opts[] = {"-h", "--help", NULL};
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            export_usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1])
            return atlas_cli_unknown_option("export", argv[i], opts);
        if (dir) {
            fprintf(stderr, "atlas export: one directory, not '%s' and '%s'\n", dir, argv[i]);
            return 2;
        }
        dir = argv[i];
    }
    if (!dir || !*dir) {
        export_usage(stderr);
        return 2;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "atlas export: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    size_t n, bytes = 0;
    const atlas_memdir_file *files = atlas_cli_embedded_files(&n);
    /* the mark first: an export cut short is still one that the next export replaces */
    if (may_write(dir, files, n) || write_file(dir, MARK, MARK_TEXT, sizeof MARK_TEXT - 1))
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (write_file(dir, files[i].name, files[i].data, files[i].size)) return 1;
        bytes += files[i].size;
    }
    printf("wrote %zu files (%.1f MB) of the embedded default model to %s\n", n, bytes / 1e6,
           dir);
    return 0;
}
