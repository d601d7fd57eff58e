/* cli/info.c — `atlas info -m DIR`: what a model is, which backend would run it and why, and
 * whether it fits, from its headers alone (`--load` loads it too). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "atlas/model.h"
#include "cli/cli.h"
#include "cli/default_model.h"
#include "cli/options.h"

static const char *const info_options[] = {"-h", "--help", "-m", "--model", "--device",
                                           "--kernels", "--load", "--kv-cache-dtype", NULL};

static void usage(FILE *f) {
    fprintf(f,
            "usage: atlas info [-m DIR] [--device cpu|cuda[:N]|auto] [--kv-cache-dtype T] [--load]\n"
            "  Prints a model's architecture, shapes, parameter count, dtypes, each weight\n"
            "  group's format (quantized ones too), a mixture-of-experts model's experts, the\n"
            "  bytes a token reads (of a MoE layer's experts, the ones it is routed to) and the\n"
            "  memory a load would take (weights and KV cache) against what the backend has,\n"
            "  from its headers alone: no weight is read.\n"
            "  -m, --model DIR   model directory (default %s)\n"
            "  --device D        the device to consider (default auto)\n"
            "  --load            also load it (reads every weight) and print what only the\n"
            "                    loaded backend knows: the GPU kernels chosen, CPU threads\n"
            "  --kernels K       native (default) or portable GPU code; implies --load\n"
            "  --kv-cache-dtype T  auto (default), bf16 or fp8: the KV cache to size (with\n"
            "                    --load: what became of the checkpoint's k_scale / v_scale)\n"
            "  -h, --help        this help\n",
            atlas_cli_default_model());
}

static double mib(size_t b) { return b / 1048576.0; }

static void print_survey(const char *dir, const atlas_model_survey *s) {
    if (atlas_cli_is_default_model(dir))
        printf("model:         %s (the default model, embedded in this binary)\n", dir);
    else
        printf("model:         %s\n", dir);
    printf("architecture:  %s\n", s->architecture);
    printf("parameters:    %lld (%.1f M)\n", (long long)s->n_params, s->n_params / 1e6);
    printf("weights:       %s, %.1f MiB\n", s->dtype, mib(s->weight_bytes));
    if (strcmp(s->quantization, "none")) printf("quantization:  %s\n", s->quantization);
    if (s->formats[0]) printf("formats:       %s\n", s->formats);
    char routed[64] = "";
    if (s->n_experts)
        snprintf(routed, sizeof routed, " (%d of %d experts a MoE layer)", s->n_experts_used,
                 s->n_experts);
    printf("a token reads: %.2f MiB of weights%s + %.1f KiB per token of context (KV)\n",
           mib(s->token_weight_bytes), routed, s->kv_token_bytes / 1024.0);
    printf("layers:        %d\n", s->n_layers);
    printf("hidden:        %d\n", s->hidden);
    printf("heads:         %d query, %d key/value (head_dim %d)\n", s->n_heads, s->n_kv_heads,
           s->head_dim);
    if (s->n_experts) {
        printf("experts:       %d a layer, %d a token, each an MLP of %d (%d of %d layers)\n",
               s->n_experts, s->n_experts_used, s->expert_ffn, s->n_moe_layers, s->n_layers);
        if (s->n_moe_layers < s->n_layers) printf("intermediate:  %d (the dense layers)\n",
                                                  s->intermediate);
    } else {
        printf("intermediate:  %d\n", s->intermediate);
    }
    printf("vocabulary:    %d%s\n", s->vocab_size, s->tied_embeddings ? " (tied embeddings)" : "");
    printf("context:       %d positions\n", s->max_position);
    printf("tokenizer:     %s\n", s->has_tokenizer ? "tokenizer.json" : "missing (tokenizer.json)");
    printf("backend:       %s (%s)\n", s->backend, s->backend_why);
    size_t elems = (size_t)2 * s->n_layers * s->n_kv_heads * s->head_dim; /* a token's K and V */
    size_t es = elems ? s->kv_token_bytes / elems : 0;
    printf("kv cache:      %d blocks of %d tokens, %.1f MiB (%s)\n", s->kv_blocks,
           s->kv_block_size, mib(s->kv_bytes), es == 1 ? "fp8 e4m3" : es == 2 ? "bf16" : "fp32");
    if (!s->available_what[0])
        printf("memory:        needs %.2f GiB; what is available cannot be known here\n",
               s->needed_bytes / 1073741824.0);
    else
        printf("memory:        needs %.2f GiB of %.2f GiB available (%s)%s\n",
               s->needed_bytes / 1073741824.0, s->available_bytes / 1073741824.0,
               s->available_what, s->fits ? "" : ": does not fit, a load is refused "
                                                 "(--no-memory-check loads anyway)");
}

/* --load: what the loaded backend knows beyond the headers. */
static int print_loaded(const char *dir, const atlas_model_params *p) {
    atlas_model *m = NULL;
    if (atlas_model_load(dir, p, &m) != ATLAS_OK) {
        fprintf(stderr, "atlas info: %s\n", atlas_last_error());
        return 1;
    }
    atlas_model_info i;
    atlas_model_get_info(m, &i);
    printf("loaded:        %s (%s)\n", i.backend, i.backend_why);
    if (i.kernels && *i.kernels) printf("kernels:       %s\n", i.kernels);
    if (i.n_threads) printf("threads:       %d\n", i.n_threads);
    if (i.kv_scales && *i.kv_scales) printf("kv scales:     %s\n", i.kv_scales);
    if (atlas_model_release(m) != ATLAS_OK) {
        fprintf(stderr, "atlas info: %s\n", atlas_last_error());
        return 1;
    }
    return 0;
}

int atlas_cli_info(int argc, char **argv) {
    const char *dir = NULL;
    bool load = false;
    atlas_model_params p = atlas_model_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = atlas_cli_resolve_option(argv[i], info_options);
        if (!atlas_cli_known_option(a, info_options))
            return atlas_cli_unknown_option("info", a, info_options);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--load")) {
            load = true;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--device") ||
                    !strcmp(a, "--kernels") || !strcmp(a, "--kv-cache-dtype")) && i + 1 == argc) {
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
            load = true; /* the kernels are chosen when a model loads */
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            if (atlas_cli_parse_kv_dtype("info", argv[++i], &p.kv_dtype)) return 2;
        } else {
            fprintf(stderr, "atlas info: unknown argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!dir) dir = atlas_cli_default_model();
    atlas_model_survey s;
    if (atlas_model_inspect(dir, &p, &s) != ATLAS_OK) {
        fprintf(stderr, "atlas info: %s\n", atlas_last_error());
        atlas_cli_device_hint("info", p.device);
        return 1;
    }
    print_survey(dir, &s);
    fflush(stdout);
    return load ? print_loaded(dir, &p) : 0;
}
