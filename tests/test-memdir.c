/* test-memdir.c — a model directory held in memory (atlas/memdir.h, core/memdir.c): the
 * default model's files read into buffers and registered load and decode exactly as the
 * directory on disk does; a name the directory lacks does not exist (no fallback to disk);
 * bad registrations are refused with a message; the weights' memfd is sealed. */
#include <fcntl.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/memdir.h"
#include "atlas/model.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "core/file.h"
#include "core/memdir.h"
#include "greedy.h"
#include "harness.h"

static const char *const names[] = {"config.json", "generation_config.json", "tokenizer.json",
                                    "tokenizer_config.json", "model.safetensors"};
#define N_FILES (sizeof names / sizeof names[0])
#define STEPS 12

static char disk_dir[4096];

/* Greedy ids of a fixed prompt on the model in dir, on the CPU. */
static void decode(const char *dir, int32_t *ids) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    atlas_model *m = NULL;
    memset(ids, 0xff, STEPS * sizeof *ids);
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return;
    static const int32_t prompt[] = {1, 200, 300, 400, 500};
    int32_t table[4] = {0, 1, 2, 3};
    CHECK_OK(greedy_run(m, prompt, 5, table, atlas_model_kv_block_size(m), STEPS, 0, ids));
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    CHECK(!strcmp(info.dir, dir));
    CHECK_OK(atlas_model_release(m));
}

static void test_refused(const atlas_memdir_file *files) {
    atlas_memdir_file bad[2] = {files[0], files[0]};
    CHECK(atlas_memdir_add("@test/dup-names", bad, 2) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "given twice") != NULL);
    bad[1].name = "sub/config.json";
    CHECK(atlas_memdir_add("@test/slash", bad, 2) == ATLAS_ERR_INVALID);
    CHECK(atlas_memdir_add("", files, 1) == ATLAS_ERR_INVALID);
    CHECK(atlas_memdir_add("@test/", files, 1) == ATLAS_ERR_INVALID);
    CHECK(atlas_memdir_add(NULL, files, 1) == ATLAS_ERR_INVALID);
    CHECK(atlas_memdir_add("@test/model", files, 1) == ATLAS_ERR_INVALID); /* registered */
    CHECK(strstr(atlas_last_error(), "already registered") != NULL);
}

/* Only the registered names exist; a real file at the same path is not looked at. */
static void test_shadowing(const atlas_memdir_file *files) {
    char dir[4096], path[4200];
    if (!harness_mkdtemp(dir, sizeof dir, "memdir")) return;
    snprintf(path, sizeof path, "%s/extra.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) fputs("{}", f), fclose(f);
    CHECK(atlas_file_exists(path));
    CHECK_OK(atlas_memdir_add(dir, files, 1)); /* config.json only */
    CHECK(!atlas_file_exists(path));
    char *text = NULL;
    CHECK(atlas_file_read(path, &text, NULL) == ATLAS_ERR_IO && text == NULL);
    CHECK(strstr(atlas_last_error(), "no such file in memory") != NULL);
    atlas_file_map map = {0};
    CHECK(atlas_file_map_open(path, &map) == ATLAS_ERR_IO);
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    atlas_model *m = NULL;
    CHECK(atlas_model_load(dir, &p, &m) != ATLAS_OK && m == NULL); /* only config.json in memory */
    /* the layout check before the load looks in memory too: it finds no weights there */
    CHECK_MSG(strstr(atlas_last_error(), "no model.safetensors") != NULL, "%s", atlas_last_error());
    harness_rm_rf(dir);
}

int main(void) {
    const char *src = getenv("ATLAS_SOURCE_DIR");
    snprintf(disk_dir, sizeof disk_dir, "%s/models/default", src && *src ? src : ".");
    atlas_memdir_file files[N_FILES];
    char *bufs[N_FILES] = {0};
    for (size_t i = 0; i < N_FILES; i++) {
        char path[4200];
        size_t len = 0;
        snprintf(path, sizeof path, "%s/%s", disk_dir, names[i]);
        CHECK_OK(atlas_file_read(path, &bufs[i], &len));
        files[i] = (atlas_memdir_file){names[i], bufs[i], len};
    }
    if (harness_failures) return harness_finish();
    CHECK_OK(atlas_memdir_add("@test/model", files, N_FILES));

    /* the files, as core/file.c serves them */
    CHECK(atlas_file_exists("@test/model"));
    CHECK(atlas_file_exists("@test/model/config.json"));
    CHECK(!atlas_file_exists("@test/model/model.safetensors.index.json"));
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(atlas_file_read("@test/model/config.json", &text, &len));
    CHECK(text && len == files[0].size && !memcmp(text, bufs[0], len) && text[len] == '\0');
    free(text);
    atlas_file_map map = {0};
    CHECK_OK(atlas_file_map_open("@test/model/model.safetensors", &map));
    CHECK(map.fd_open && map.size == files[4].size && !memcmp(map.data, bufs[4], map.size));
    unsigned char head[64], tail[64];
    CHECK_OK(atlas_file_read_at(map.fd, head, sizeof head, 0));
    CHECK_OK(atlas_file_read_at(map.fd, tail, sizeof tail, map.size - sizeof tail));
    CHECK(!memcmp(head, bufs[4], 64) && !memcmp(tail, bufs[4] + map.size - 64, 64));
    CHECK((fcntl(map.fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE) != 0); /* nothing can change them */
    CHECK(write(map.fd, "x", 1) < 0);
    atlas_file_map_close(&map);

    /* the loaders: tokenizer, chat template, model; the same tokens as from disk */
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load("@test/model", &tok));
    atlas_tokenizer_free(tok);
    atlas_template *tmpl = NULL;
    CHECK_OK(atlas_template_load("@test/model", &tmpl));
    CHECK(tmpl && strstr(atlas_template_source(tmpl), "im_start") != NULL);
    atlas_template_free(tmpl);
    int32_t from_disk[STEPS], from_memory[STEPS];
    decode(disk_dir, from_disk);
    decode("@test/model", from_memory);
    CHECK(!memcmp(from_disk, from_memory, sizeof from_disk));
    CHECK(from_memory[0] >= 0 && from_memory[STEPS - 1] >= 0);

    test_refused(files);
    test_shadowing(files);
    /* the registered bytes are borrowed for the life of the process: never freed here */
    return harness_finish();
}
