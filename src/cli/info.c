/* cli/info.c — `atlas info -m DIR`: what a model is and which backend would run it, and why. */
#include <stdio.h>
#include <string.h>

#include "atlas/model.h"
#include "cli/cli.h"
#include "cli/default_model.h"
#include "cli/options.h"

static const char *const info_options[] = {"-h", "--help", "-m", "--model", "--device",
                                           "--kernels", NULL};

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas info [-m DIR] [--device cpu|cuda[:N]|auto] [--kernels native|portable]\n"
            "  Loads the model and prints its architecture, shapes, parameter count, dtypes,\n"
            "  memory, and the backend that runs it and why.\n"
            "  -m, --model DIR   model directory (default %s)\n"
            "  --device D        the device to try (default auto)\n"
            "  --kernels K       native (default) or portable GPU code\n"
            "  -h, --help        this help\n",
            atlas_cli_default_model());
}

static void print_info(const atlas_model_info *i) {
    if (atlas_cli_is_default_model(i->dir))
        printf("model:         %s (the default model, embedded in this binary)\n", i->dir);
    else
        printf("model:         %s\n", i->dir);
    printf("architecture:  %s\n", i->architecture);
    printf("parameters:    %lld (%.1f M)\n", (long long)i->n_params, i->n_params / 1e6);
    printf("weights:       %s, %.1f MiB\n", i->dtype, i->weight_bytes / 1048576.0);
    printf("layers:        %d\n", i->n_layers);
    printf("hidden:        %d\n", i->hidden);
    printf("heads:         %d query, %d key/value (head_dim %d)\n", i->n_heads, i->n_kv_heads,
           i->head_dim);
    printf("intermediate:  %d\n", i->intermediate);
    printf("vocabulary:    %d%s\n", i->vocab_size, i->tied_embeddings ? " (tied embeddings)" : "");
    printf("context:       %d positions\n", i->max_position);
    printf("backend:       %s (%s)\n", i->backend, i->backend_why);
    if (i->kernels && *i->kernels) printf("kernels:       %s\n", i->kernels);
    if (i->n_threads) printf("threads:       %d\n", i->n_threads);
    printf("kv cache:      %d blocks of %d tokens, %.1f MiB (fp%d)\n", i->kv_blocks,
           i->kv_block_size, i->kv_bytes / 1048576.0,
           i->kv_blocks ? (int)(i->kv_bytes * 8 / ((size_t)2 * i->n_layers * i->kv_blocks *
                                                   i->kv_block_size * i->n_kv_heads * i->head_dim))
                        : 0);
}

int atlas_cli_info(int argc, char **argv) {
    const char *dir = NULL;
    atlas_model_params p = atlas_model_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = atlas_cli_resolve_option(argv[i], info_options);
        if (!atlas_cli_known_option(a, info_options))
            return atlas_cli_unknown_option("info", a, info_options);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--device") ||
                    !strcmp(a, "--kernels")) && i + 1 == argc) {
            fprintf(stderr, "atlas info: %s needs a value (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            dir = argv[++i];
        } else if (!strcmp(a, "--device")) {
            const char *v = argv[++i];
            if (atlas_cli_parse_device(v, &p.device, &p.gpu)) {
                fprintf(stderr, "atlas info: --device: '%s' (want cpu, cuda, cuda:N or auto)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--kernels")) {
            const char *v = argv[++i];
            if (atlas_cli_parse_kernels(v, &p.kernels)) {
                fprintf(stderr, "atlas info: --kernels: '%s' (want native or portable)\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "atlas info: unknown argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!dir) dir = atlas_cli_default_model();
    atlas_model *m = NULL;
    if (atlas_model_load(dir, &p, &m) != ATLAS_OK) {
        fprintf(stderr, "atlas info: %s\n", atlas_last_error());
        atlas_cli_device_hint("info", p.device);
        return 1;
    }
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    print_info(&info);
    if (atlas_model_release(m) != ATLAS_OK) {
        fprintf(stderr, "atlas info: %s\n", atlas_last_error());
        return 1;
    }
    return 0;
}
