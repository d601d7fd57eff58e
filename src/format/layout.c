/* format/layout.c — what a path given as a model directory holds (format/layout.h). */
#include "format/layout.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/memdir.h"

/* What a user who has something else needs to hear: what atlas reads and how to get it. */
#define HF_DIR "Hugging Face model directories (config.json, tokenizer.json, *.safetensors)"
#define HF_GET "`huggingface-cli download ORG/NAME --local-dir DIR` writes one"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* A GGUF file by its name or its first four bytes (the magic "GGUF"). */
static bool is_gguf(const char *path) {
    if (ends_with(path, ".gguf")) return true;
    struct stat st;
    int fd = atlas_file_open_regular(path, &st); /* never a FIFO's open, which would wait */
    if (fd < 0) return false;
    char magic[4];
    ssize_t n = read(fd, magic, sizeof magic);
    close(fd);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

static bool is_torch_weights(const char *name) {
    return ends_with(name, ".bin") || ends_with(name, ".pth") || ends_with(name, ".pt");
}

/* ORG/NAME as the hub spells ids: one slash, letters, digits, '.', '_' and '-' around it. */
static bool looks_like_hub_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/') || s[0] == '.') return false;
    for (const char *p = s; *p; p++)
        if (p != slash && !(*p == '.' || *p == '_' || *p == '-' || (*p >= '0' && *p <= '9') ||
                            (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
            return false;
    return true;
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* What a directory holds besides (or instead of) the files atlas reads. */
typedef struct layout_scan {
    char gguf[256];      /* the first *.gguf file */
    char torch[256];     /* the first PyTorch weights file (*.bin, *.pth, *.pt) */
    char st[256];        /* the first *.safetensors file */
    char model[256];     /* the first subdirectory with a config.json */
    int n_models;        /* subdirectories with a config.json */
    bool snapshots;      /* a snapshots/ subdirectory: a Hugging Face cache entry */
    bool params;         /* params.json: Meta's or Mistral's original layout */
} layout_scan;

static void scan_dir(const char *dir, layout_scan *s) {
    memset(s, 0, sizeof *s);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (n[0] == '.') continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, n) >= (int)sizeof path) continue;
        if (!strcmp(n, "snapshots") && is_dir(path)) s->snapshots = true;
        else if (!strcmp(n, "params.json")) s->params = true;
        else if (ends_with(n, ".gguf") && !s->gguf[0]) snprintf(s->gguf, sizeof s->gguf, "%s", n);
        else if (is_torch_weights(n) && !s->torch[0] && strcmp(n, "training_args.bin"))
            snprintf(s->torch, sizeof s->torch, "%s", n);
        else if (ends_with(n, ".safetensors") && !s->st[0]) snprintf(s->st, sizeof s->st, "%s", n);
        else if (is_dir(path)) {
            char cfg[4096];
            if (snprintf(cfg, sizeof cfg, "%s/config.json", path) >= (int)sizeof cfg) continue;
            if (!atlas_file_exists(cfg)) continue;
            if (!s->n_models++) snprintf(s->model, sizeof s->model, "%s", n);
        }
    }
    closedir(d);
}

/* A cache entry (models--ORG--NAME) holds snapshots/<revision>/: the revision refs/main
 * names, else the first there is, into rev ("" when there is none). */
static void cache_revision(const char *dir, char *rev, size_t cap) {
    rev[0] = '\0';
    char path[4096];
    snprintf(path, sizeof path, "%s/refs/main", dir);
    FILE *f = fopen(path, "re");
    if (f) {
        if (fgets(rev, (int)cap, f)) rev[strcspn(rev, "\r\n")] = '\0';
        fclose(f);
        snprintf(path, sizeof path, "%s/snapshots/%s", dir, rev);
        if (rev[0] && is_dir(path)) return;
        rev[0] = '\0';
    }
    snprintf(path, sizeof path, "%s/snapshots", dir);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(rev, cap, "%s", de->d_name);
            break;
        }
    closedir(d);
}

static atlas_status missing(const char *dir) {
    if (looks_like_hub_id(dir)) {
        const char *name = strchr(dir, '/') + 1;
        return atlas_fail(ATLAS_ERR_IO,
                          "%s: no such directory; atlas reads models from disk and downloads "
                          "none. If it is a Hugging Face hub id: `huggingface-cli download %s "
                          "--local-dir ~/models/%s`, then give ~/models/%s",
                          dir, dir, name, name);
    }
    if (!strchr(dir, '/'))
        return atlas_fail(ATLAS_ERR_IO,
                          "%s: no such directory; atlas reads a model directory from disk and "
                          "looks no name up in a registry: get one from the Hugging Face hub "
                          "with `huggingface-cli download ORG/NAME --local-dir ~/models/%s`",
                          dir, dir);
    return atlas_fail(ATLAS_ERR_IO, "%s: no such file or directory", dir);
}

/* dir is a file: say which, and what to give instead. */
static atlas_status not_a_dir(const char *dir) {
    if (is_gguf(dir))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: a GGUF file: GGUF is not read; atlas "
                          "serves " HF_DIR ": " HF_GET " (from the original repository, not a "
                          "-GGUF one)", dir);
    if (is_torch_weights(dir))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: PyTorch weights are not read; atlas "
                          "serves " HF_DIR, dir);
    const char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : dir;
    if (ends_with(base, ".safetensors") || ends_with(base, ".json"))
        return atlas_fail(ATLAS_ERR_IO, "%s: a file; give the directory that holds it "
                          "(%.*s)", dir, slash ? (int)(slash - dir) : 1, slash ? dir : ".");
    return atlas_fail(ATLAS_ERR_IO, "%s: not a directory; atlas serves " HF_DIR, dir);
}

/* dir is a directory without config.json. */
static atlas_status no_config(const char *dir, const layout_scan *s) {
    if (s->snapshots) {
        char rev[256];
        cache_revision(dir, rev, sizeof rev);
        if (!rev[0])
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: a Hugging Face cache entry with no "
                              "snapshot in snapshots/ (was the download finished?)", dir);
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: a Hugging Face cache entry, not a model "
                          "directory: the model is in snapshots/<revision>, here %s/snapshots/%s",
                          dir, dir, rev);
    }
    if (s->gguf[0])
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: GGUF files (%s), no config.json: GGUF is "
                          "not read; atlas serves " HF_DIR ": " HF_GET, dir, s->gguf);
    if (s->params)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: params.json and no config.json: the "
                          "original (Meta or Mistral) layout is not read; atlas serves " HF_DIR
                          " (on the hub, the repository's files outside original/)", dir);
    if (s->n_models)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s: no config.json, but %s/%s has one%s: give "
                          "one model's directory (atlas serve --models-dir %s serves them all)",
                          dir, dir, s->model, s->n_models > 1 ? " (and others beside it)" : "",
                          dir);
    return atlas_fail(ATLAS_ERR_IO, "%s: no config.json: not one of the " HF_DIR
                      " atlas serves", dir);
}

/* dir has config.json but neither model.safetensors nor its index. */
static atlas_status no_weights(const char *dir, const layout_scan *s) {
    if (s->torch[0])
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s/%s: PyTorch .bin weights are not read; "
                          "atlas reads safetensors (model.safetensors, or shards with "
                          "model.safetensors.index.json), which most hub repositories have: "
                          "`huggingface-cli download ORG/NAME --include '*.safetensors' '*.json' "
                          "--local-dir %s`", dir, s->torch, dir);
    if (s->gguf[0])
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "%s/%s: GGUF is not read; atlas reads "
                          "safetensors weights beside config.json", dir, s->gguf);
    if (s->st[0])
        return atlas_fail(ATLAS_ERR_NOT_FOUND, "%s: %s is there, but neither model.safetensors "
                          "nor model.safetensors.index.json (which lists the shards): download "
                          "the index too", dir, s->st);
    return atlas_fail(ATLAS_ERR_NOT_FOUND, "%s: no model.safetensors or "
                      "model.safetensors.index.json (the weights)", dir);
}

atlas_status atlas_layout_check(const char *dir) {
    if (!dir || !*dir) return atlas_fail(ATLAS_ERR_INVALID, "no model directory given");
    char cfg[4096], index[4096], single[4096];
    ATLAS_TRY(atlas_path_join(cfg, sizeof cfg, dir, "config.json"));
    ATLAS_TRY(atlas_path_join(index, sizeof index, dir, "model.safetensors.index.json"));
    ATLAS_TRY(atlas_path_join(single, sizeof single, dir, "model.safetensors"));
    bool has_cfg = atlas_file_exists(cfg);
    if (has_cfg && (atlas_file_exists(index) || atlas_file_exists(single))) return ATLAS_OK;
    size_t n_mem;
    layout_scan s;
    memset(&s, 0, sizeof s);
    if (!atlas_memdir_files(dir, &n_mem)) {
        struct stat st;
        if (stat(dir, &st) != 0) {
            if (errno == ENOENT) return missing(dir);
            return atlas_fail(ATLAS_ERR_IO, "%s: %s", dir, strerror(errno));
        }
        if (!S_ISDIR(st.st_mode)) return not_a_dir(dir);
        scan_dir(dir, &s);
    }
    return has_cfg ? no_weights(dir, &s) : no_config(dir, &s);
}
