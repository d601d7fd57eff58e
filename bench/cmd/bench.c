/* bench/cmd/bench.c — `atlas bench -m DIR [-p 512[,2048]] [-n 128] [--batch 8[,32]]`: load, prefill
 * and decode speed of a model (decode of one sequence, then of B sequences a step for each
 * --batch B), and, measured in the same run on the same GPU, the ceilings they are
 * judged against (issue 4):
 *   decode ratio  = decode tok/s x bytes read per token / read bandwidth
 *   prefill ratio = prefill FLOP/s / bf16 matrix rate (best GEMM the backend has)
 * Bytes read per token: every linear layer and the output head as stored (an untied
 * embedding table is not read), and the KV cache at the decode steps' mean context. Prefill FLOPs: 2 x tokens x linear weights (in an MoE layer the
 * router and the experts a token is routed to) + causal attention (4 x H x hd x tokens x
 * (tokens + 1) / 2 a layer; over every key, also in sliding-window layers: an overcount
 * there) + the output head for one row.
 * --no-graphs, --no-pdl, --no-cublaslt and --skip-ops make the model with that part of the
 * CUDA backend off (atlas_backend_options), to measure what it gives.
 * Built into the `atlas` program (src/cli/main.c dispatches here); it includes public headers
 * and bench_internal.h only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "atlas/model.h"
#include "atlas/parallel.h"
#include "atlas/status.h"
#include "bench_internal.h"

enum { MAX_P = 8, MAX_B = 8, BLOCK = 16 };

/* Returns a failed status (the library's ATLAS_TRY is internal). */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        atlas_status try_ = (x);                                                                   \
        if (try_ != ATLAS_OK) return try_;                                                         \
    } while (0)

typedef struct bench_opts {
    const char *dir;
    int p[MAX_P], n_p, n, reps;
    int batch[MAX_B], n_batch; /* --batch: decode B sequences at once, for each B */
    atlas_device device;
    double read_gib;
    int gemm;
    int tp; /* --tensor-parallel */
    int load_only; /* --load-only N: N timed swaps, then exit (0: the whole bench) */
    int gpu;       /* --device cuda:N */
    atlas_backend_options backend; /* --no-graphs, --no-pdl, --no-cublaslt, --skip-ops */
    int no_memory_check; /* --no-memory-check */
    int threads;         /* --threads: CPU workers (0: one per core) */
    atlas_cpu_activations cpu_act; /* --cpu-activations */
    atlas_gpu_activations gpu_act; /* --gpu-activations */
    atlas_kv_dtype kv_dtype;       /* --kv-cache-dtype */
    int mlp_chunk; /* --mlp-chunk: the MLP's rows a pass (0: the model's default) */
} bench_opts;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The process's CPU time, user and system, every thread: on a shared machine it says what
 * a prefill cost when the wall time says how busy the others were. */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int usage(void) {
    fprintf(stderr, "usage: atlas bench [-m DIR] [-p TOKENS[,TOKENS...]] [-n TOKENS] "
                    "[--batch B[,B...]]\n"
                    "                   [--threads N]   (CPU threads; default one per core)\n"
                    "                   [--mlp-chunk N]   (the MLP's rows a pass; default 2048)\n"
                    "                   [--cpu-activations auto|fp32|bf16|int8]   (the CPU's matmuls)\n"
                    "                   [--gpu-activations fp32|int8]   (a GPU's INT4 decode matmuls)\n"
                    "                   [--kv-cache-dtype auto|bf16|fp8]   (the KV cache's elements)\n"
                    "                   [--device auto|cuda[:N]|cpu] [--reps N] [--read-gib G] [--gemm N]\n"
                    "                   [--load-only N]   (N timed loads again after the first, "
                    "each printed, and on the CPU the page-cache read probe beside them; nothing else)\n"
                    "                   [--no-graphs] [--no-pdl] [--no-cublaslt] [--kernels native|portable]\n"
                    "                   [--no-memory-check]   (load past the check of free memory)\n"
                    "                   [--skip-ops norm,matmul,rope,kv_store,attention,swiglu]\n"
                    "                     (those ops left out of every batch: wrong results, to\n"
                    "                      time what the others cost)\n"
                    "                   [--tensor-parallel N]   (N > 1 needs N GPUs and "
                    "libnccl.so.2; not wired yet)\n");
    return 2;
}

/* "attention,norm" into ATLAS_SKIP_* bits; -1 for an unknown name. */
static int parse_skip(const char *v) {
    static const char *const names[] = {"norm", "matmul", "rope", "kv_store", "attention",
                                         "swiglu"};
    static const int bit[] = {ATLAS_SKIP_NORM, ATLAS_SKIP_MATMUL, ATLAS_SKIP_ROPE,
                              ATLAS_SKIP_KV_STORE, ATLAS_SKIP_ATTENTION, ATLAS_SKIP_SWIGLU};
    int listed = atlas_cli_parse_names(v, names, 6), bits = 0;
    if (listed < 0) return -1;
    for (int i = 0; i < 6; i++)
        if (listed & 1 << i) bits |= bit[i];
    return bits;
}

static const char *const bench_options[] = {
    "-h", "--help", "--no-graphs", "--no-pdl", "--no-cublaslt", "-m", "-p", "--batch", "-n",
    "--reps", "--read-gib", "--load-only", "--skip-ops", "--gemm", "--tensor-parallel", "--device",
    "--kernels", "--no-memory-check", "--threads", "--mlp-chunk", "--cpu-activations",
    "--gpu-activations", "--kv-cache-dtype", NULL};

/* v as a whole number in [lo, hi] into *out; -1 (nothing stored) otherwise. */
static int parse_count(const char *v, long lo, long hi, int *out) {
    char *end;
    long t = strtol(v, &end, 10);
    if (end == v || *end || t < lo || t > hi) return -1;
    *out = (int)t;
    return 0;
}

/* The device defaults to auto, as `atlas run`'s does: CUDA when usable, else the CPU. */
static int parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){atlas_cli_default_model(), {512}, 1, 128, 3, {0}, 0, ATLAS_DEVICE_AUTO, 8.0,
                      8192, 1, 0, 0, {0}, 0, 0, ATLAS_CPU_ACT_AUTO, ATLAS_GPU_ACT_FP32,
                      ATLAS_KV_DTYPE_AUTO, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = atlas_cli_resolve_option(argv[i], bench_options), *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!atlas_cli_known_option(a, bench_options)) {
            atlas_cli_unknown_option("bench", a, bench_options);
            return usage();
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage();
        if (!strcmp(a, "--no-graphs")) {
            o->backend.no_graphs = 1;
            continue;
        }
        if (!strcmp(a, "--no-pdl")) {
            o->backend.no_pdl = 1;
            continue;
        }
        if (!strcmp(a, "--no-memory-check")) {
            o->no_memory_check = 1;
            continue;
        }
        if (!strcmp(a, "--no-cublaslt")) {
            o->backend.no_cublaslt = 1;
            continue;
        }
        if (!v) return usage();
        i++;
        if (!strcmp(a, "-m")) {
            o->dir = v;
        } else if (!strcmp(a, "-p")) {
            o->n_p = atlas_cli_parse_ints(v, o->p, MAX_P);
        } else if (!strcmp(a, "--batch")) {
            o->n_batch = atlas_cli_parse_ints(v, o->batch, MAX_B);
        } else if (!strcmp(a, "-n")) {
            o->n = atoi(v);
        } else if (!strcmp(a, "--threads")) {
            if (parse_count(v, 1, 1024, &o->threads)) return usage();
        } else if (!strcmp(a, "--mlp-chunk")) {
            if (parse_count(v, 1, 65536, &o->mlp_chunk)) return usage();
        } else if (!strcmp(a, "--reps")) {
            o->reps = atoi(v);
        } else if (!strcmp(a, "--read-gib")) {
            o->read_gib = atof(v);
        } else if (!strcmp(a, "--load-only")) {
            o->load_only = atoi(v);
            if (o->load_only < 1 || o->load_only > 100) return usage();
        } else if (!strcmp(a, "--skip-ops")) {
            int bits = parse_skip(v);
            if (bits < 0) return usage();
            o->backend.skip_ops = (unsigned)bits;
        } else if (!strcmp(a, "--gemm")) {
            o->gemm = atoi(v);
        } else if (!strcmp(a, "--tensor-parallel")) {
            if (parse_count(v, 1, 64, &o->tp)) return usage();
        } else if (!strcmp(a, "--device")) {
            if (atlas_cli_parse_device(v, &o->device, &o->gpu)) return usage();
        } else if (!strcmp(a, "--kernels")) {
            atlas_kernels k;
            if (atlas_cli_parse_kernels(v, &k)) return usage();
            o->backend.portable = k == ATLAS_KERNELS_PORTABLE;
        } else if (!strcmp(a, "--cpu-activations")) {
            if (atlas_cli_parse_cpu_activations(v, &o->cpu_act)) return usage();
        } else if (!strcmp(a, "--gpu-activations")) {
            if (atlas_cli_parse_gpu_activations(v, &o->gpu_act)) return usage();
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            if (atlas_cli_parse_kv_dtype("bench", v, &o->kv_dtype)) return 2;
        } else {
            return usage();
        }
    }
    for (int i = 0; i < o->n_p; i++)
        if (o->p[i] < 1) return usage();
    for (int i = 0; i < o->n_batch; i++)
        if (o->batch[i] < 1 || o->batch[i] > 65536) return usage(); /* max_batch_tokens' range */
    if (o->n_p < 1 || o->n < 1 || o->reps < 1 || o->read_gib <= 0 || o->gemm < 128) return usage();
    return 0;
}

/* One sequence's `n` tokens from position `start` (blocks 0, 1, ...): *id gets the argmax;
 * id NULL: queued (atlas_model_forward_argmax_queue; a token ATLAS_BATCH_PREV(0): the step
 * before's id). */
static atlas_status forward_seq(atlas_model *m, const int32_t *tokens, int start, int n,
                                const int32_t *table, int max_blocks, int32_t *id) {
    int32_t *pos = malloc(sizeof(int32_t) * n);
    if (!pos) return ATLAS_ERR_NOMEM;
    for (int i = 0; i < n; i++) pos[i] = start + i;
    int32_t seq_start[2] = {0, n}, ctx = start + n, row = n - 1;
    atlas_batch b = {.n_tokens = n, .tokens = tokens, .positions = pos, .n_seqs = 1,
                     .seq_start = seq_start, .seq_ctx = &ctx, .block_table = table,
                     .max_blocks = max_blocks, .n_logits = 1, .logit_rows = &row};
    atlas_status st = id ? atlas_model_forward_argmax(m, &b, id)
                         : atlas_model_forward_argmax_queue(m, &b);
    free(pos);
    return st;
}

/* steps greedy steps from position ctx, the first fed *id, *id the last one's argmax; *dt
 * their time. queued: each step queued before the one before is collected. */
static atlas_status decode_run(atlas_model *m, int queued, int ctx, int steps,
                               const int32_t *table, int max_blocks, int32_t *id, double *dt) {
    double s = now_s();
    if (!queued) {
        for (int i = 0; i < steps; i++, ctx++)
            TRY(forward_seq(m, id, ctx, 1, table, max_blocks, id));
        *dt = now_s() - s;
        return ATLAS_OK;
    }
    TRY(forward_seq(m, id, ctx++, 1, table, max_blocks, NULL));
    const int32_t prev = ATLAS_BATCH_PREV(0);
    for (int i = 1; i <= steps; i++, ctx++) {
        atlas_status st = i < steps ? forward_seq(m, &prev, ctx, 1, table, max_blocks, NULL)
                                    : ATLAS_OK;
        atlas_status c = atlas_model_argmax_collect(m, id, 1); /* also after a failed queue */
        TRY(st);
        TRY(c);
    }
    *dt = now_s() - s;
    return ATLAS_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The decode steps of the main measurement again, plain, after a warm-up run of 4 (a plan
 * change drops the graphs, which the warm-up captures again): their 3 times, sorted. */
static atlas_status plain_runs(atlas_model *m, int32_t id, int p0, int steps,
                               const int32_t *table, int max_blocks, double tx[3]) {
    double t = 0;
    for (int r = -1; r < 3; r++) {
        int32_t tok = id;
        atlas_status st = decode_run(m, 0, r < 0 ? p0 : p0 + 4, r < 0 ? 4 : steps, table,
                                     max_blocks, &tok, &t);
        if (st != ATLAS_OK) return st;
        if (r >= 0) tx[r] = t;
    }
    qsort(tx, 3, sizeof *tx, cmp_double);
    return ATLAS_OK;
}

/* What decode_batch measured: the timed steps' total, their slowest, quickest and median
 * step (one slow step tells a one-time event from a steady cost), the graphs they captured
 * and replayed (CUDA; 0 on the CPU). */
typedef struct batch_run {
    double dt, step_min, step_med, step_max;
    uint64_t captured, replayed;
} batch_run;

/* B sequences decoding together, one token each a step at positions p0, p0 + 1, ...: warm-up
 * steps, then `steps` timed ones. Sequence s owns blocks [s * nb, (s + 1) * nb); no prefill:
 * the cache holds whatever is there, only the time counts. */
/* B sequences' decode steps, each the argmax (draw NULL) or each row drawn as *draw says
 * (its own seed, the counter its token's position) through the sample op. */
static atlas_status decode_batch(atlas_model *m, int B, int p0, int warm, int steps, int nb,
                                 int V, const atlas_sample_row *draw, batch_run *out) {
    int32_t *ids = malloc(sizeof(int32_t) * B), *pos = malloc(sizeof(int32_t) * B),
            *ctx = malloc(sizeof(int32_t) * B), *rows = malloc(sizeof(int32_t) * B),
            *start = malloc(sizeof(int32_t) * (B + 1)), *table = malloc(sizeof(int32_t) * B * nb);
    double *step_s = malloc(sizeof(double) * steps);
    atlas_sample_row *q = draw ? malloc(sizeof *q * B) : NULL;
    atlas_sample_out *so = draw ? malloc(sizeof *so * B) : NULL;
    atlas_status st = ids && pos && ctx && rows && start && table && step_s && (!draw || (q && so))
                          ? ATLAS_OK
                          : ATLAS_ERR_NOMEM;
    for (int s = 0; st == ATLAS_OK && s < B; s++) {
        ids[s] = (int32_t)((s * 2654435761u + 17u) % (unsigned)V);
        rows[s] = s;
        start[s] = s;
        for (int j = 0; j < nb; j++) table[s * nb + j] = s * nb + j;
    }
    if (start) start[B] = B;
    memset(out, 0, sizeof *out);
    uint64_t c0 = 0, r0 = 0, c1 = 0, r1 = 0;
    double t0 = 0;
    for (int i = 0; st == ATLAS_OK && i < warm + steps; i++) {
        if (i == warm) {
            atlas_bench_graph_counts(m, &c0, &r0);
            t0 = now_s();
        }
        for (int s = 0; s < B; s++) {
            pos[s] = p0 + i;
            ctx[s] = p0 + i + 1;
            if (ids[s] < 0 || ids[s] >= V) ids[s] = 0; /* whatever the cache held gave */
        }
        atlas_batch b = {.n_tokens = B, .tokens = ids, .positions = pos, .n_seqs = B,
                         .seq_start = start, .seq_ctx = ctx, .block_table = table,
                         .max_blocks = nb, .n_logits = B, .logit_rows = rows};
        for (int r = 0; draw && r < B; r++) {
            q[r] = *draw;
            q[r].seed = draw->seed + (uint64_t)r;
            q[r].counter = (uint64_t)(p0 + i + 1);
        }
        atlas_model_sampling smp = {.rows = q, .out = so};
        double s0 = now_s();
        st = draw ? atlas_model_forward_sample(m, &b, &smp) : atlas_model_forward_argmax(m, &b, ids);
        for (int r = 0; draw && st == ATLAS_OK && r < B; r++) ids[r] = so[r].id;
        if (i >= warm) step_s[i - warm] = now_s() - s0;
    }
    if (st == ATLAS_OK) {
        out->dt = now_s() - t0;
        atlas_bench_graph_counts(m, &c1, &r1);
        out->captured = c1 - c0;
        out->replayed = r1 - r0;
        qsort(step_s, steps, sizeof *step_s, cmp_double);
        out->step_min = step_s[0];
        out->step_med = step_s[steps / 2];
        out->step_max = step_s[steps - 1];
    }
    free(ids);
    free(pos);
    free(ctx);
    free(rows);
    free(start);
    free(table);
    free(step_s);
    free(q);
    free(so);
    return st;
}

/* What the weight upload sent through the pinned staging pool (bf16 weights, quantized codes
 * and their grids as the device keeps them or as stored, for the device to repack). */
static void print_load_path(atlas_model *m, double load_s) {
    atlas_bench_memory mem;
    if (atlas_bench_memory_get(m, &mem) != ATLAS_OK) return;
    printf("load path   %.2f GB of weights through the pinned staging pool: %.1f GB/s\n",
           mem.staged_bytes / 1e9, mem.staged_bytes / 1e9 / load_s);
}

/* The CPU's ceiling for a load: the same shards read from the page cache into warm buffers
 * in huge pages by as many threads as the backend's readers, beside the loads' rates. */
static void print_read_probe(const char *dir, int threads, double load_gbps, double first_gbps,
                             int swaps) {
    atlas_bench_read rp;
    if (atlas_bench_read_measure(dir, threads, 3, &rp) != ATLAS_OK) {
        printf("read probe  not measured: %s\n", atlas_last_error());
        return;
    }
    printf("read probe  %.1f GB/s: %d thread(s) pread the same %d file(s) (%.2f GB) from the "
           "page cache in %zu MiB pieces into warm huge-page buffers (median of 3)\n", rp.gbps,
           rp.threads, rp.files, rp.bytes / 1e9, rp.piece_bytes >> 20);
    if (swaps)
        printf("ratio       load %.1f%% of the read probe (median of %d loads again), the "
               "first load in the process %.1f%%\n", 100.0 * load_gbps / rp.gbps, swaps,
               100.0 * first_gbps / rp.gbps);
    else
        printf("ratio       load %.1f%% of the read probe (the first load in the process)\n",
               100.0 * first_gbps / rp.gbps);
}

/* The reference loader over the model's shards, beside our load rate. */
static void print_load_reference(atlas_model *m, const char *dir, double load_gbps) {
    atlas_bench_file_load fl;
    if (atlas_bench_file_load_measure(m, dir, 0, &fl) == ATLAS_OK) {
        printf("load ref    %.1f GB/s: the issue's reference loader over the same %d file(s), %.2f "
               "GB in %.3f s (%d threads, pread of %zu MiB pieces into 2 pinned buffers a thread, "
               "a stream a thread; buffers made beforehand in %.2f s)\n", fl.gbps, fl.files,
               fl.bytes / 1e9, fl.seconds, fl.threads, fl.piece_bytes >> 20, fl.setup_s);
        printf("ratio       load %.1f%% of the reference loader (%.1f GB/s of %.1f)\n",
               100.0 * load_gbps / fl.gbps, load_gbps, fl.gbps);
    } else {
        printf("load ref    not measured: %s\n", atlas_last_error());
    }
}

static int fail(const char *what) {
    fprintf(stderr, "atlas bench: %s: %s\n", what, atlas_last_error());
    return 1;
}

int atlas_cli_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    if (atlas_tp_preflight(o.tp) != ATLAS_OK) { /* before anything touches the GPU */
        fprintf(stderr, "atlas bench: --tensor-parallel %d: %s\n", o.tp, atlas_last_error());
        return 1;
    }
    int max_p = 0;
    for (int i = 0; i < o.n_p; i++) max_p = o.p[i] > max_p ? o.p[i] : max_p;
    int ctx_max = max_p + o.n + 8, max_blocks = (ctx_max + BLOCK - 1) / BLOCK;
    /* --batch: B sequences of up to p0 + n + 8 tokens each, in blocks of their own */
    int max_b = 0, batch_blocks = (o.p[0] + o.n + 8 + BLOCK - 1) / BLOCK;
    for (int i = 0; i < o.n_batch; i++) max_b = o.batch[i] > max_b ? o.batch[i] : max_b;
    atlas_model_params mp = atlas_model_default_params();
    mp.device = o.device;
    mp.max_batch_tokens = max_p > max_b ? max_p : max_b;
    mp.kv_block_size = BLOCK;
    mp.kv_tokens = (max_b * batch_blocks > max_blocks ? max_b * batch_blocks : max_blocks) * BLOCK;
    mp.load_tokenizer = 0;
    mp.gpu = o.gpu;
    mp.no_memory_check = o.no_memory_check;
    mp.n_threads = o.threads;
    if (o.mlp_chunk) mp.mlp_chunk_tokens = o.mlp_chunk;
    mp.cpu_activations = o.cpu_act;
    mp.gpu_activations = o.gpu_act;
    mp.kv_dtype = o.kv_dtype;
    atlas_model *m = NULL;
    double t0 = now_s();
    if (atlas_model_load_opts(o.dir, &mp, &o.backend, &m) != ATLAS_OK) {
        fail("loading the model");
        atlas_cli_device_hint("bench", o.device);
        return 1;
    }
    double first_s = now_s() - t0, load_s = first_s;
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    int on_cuda = !strcmp(info.backend, "cuda"); /* what --device auto resolved to */
    /* again, as a model swap: context and pinned pool kept (--load-only N: N times, on any
     * backend, each printed and the median reported) */
    int swaps = o.load_only ? o.load_only : on_cuda;
    double swap_s[100];
    for (int i = 0; i < swaps; i++) {
        if (atlas_model_release(m) != ATLAS_OK) return fail("releasing the model");
        m = NULL;
        t0 = now_s();
        if (atlas_model_load_opts(o.dir, &mp, &o.backend, &m) != ATLAS_OK)
            return fail("loading the model again");
        swap_s[i] = now_s() - t0;
        if (o.load_only) {
            atlas_model_get_info(m, &info);
            printf("load        swap %d: %.3f s, %.1f GB/s\n", i + 1, swap_s[i],
                   info.weight_bytes / 1e9 / swap_s[i]);
            if (info.times.repack_ms > 0)
                printf("load quant  %.3f s of it on the host reading and repacking quantized weights\n",
                       info.times.repack_ms / 1e3);
            print_load_path(m, swap_s[i]);
        }
    }
    if (swaps) {
        qsort(swap_s, (size_t)swaps, sizeof *swap_s, cmp_double);
        load_s = swap_s[swaps / 2];
    }
    atlas_model_get_info(m, &info);
    int V = info.vocab_size, d = info.hidden, L = info.n_layers, H = info.n_heads;
    int K = info.n_kv_heads, hd = info.head_dim, f = info.intermediate;
    /* the weights a token multiplies a layer, on average: attention, and the MLP or, in an
     * MoE layer, the router and the experts it is routed to (not all of them) */
    atlas_model_survey sv = {0};
    if (atlas_model_inspect(o.dir, &mp, &sv) != ATLAS_OK) return fail("inspecting the model");
    double moe_w = (double)sv.n_experts_used * 3.0 * sv.expert_ffn * d + (double)sv.n_experts * d;
    double layer_w = (double)d * (H + 2 * K) * hd + (double)H * hd * d +
                     ((double)(L - sv.n_moe_layers) * 3.0 * f * d + sv.n_moe_layers * moe_w) / L;
    /* the bytes a decode token reads as stored (packed weights and their scales for a
     * quantized checkpoint), the same figure atlas info prints */
    double bytes_tok = (double)info.token_weight_bytes;
    printf("model       %s (%s, %d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d)\n",
           o.dir, info.architecture, L, d, H, K, hd, f, V);
    printf("backend     %s%s%s\n", info.backend, info.backend_why && *info.backend_why ? ": " : "",
           info.backend_why ? info.backend_why : "");
    if (info.n_threads) printf("threads     %d\n", info.n_threads);
    if (info.kernels && *info.kernels) printf("kernels     %s\n", info.kernels);
    printf("load        %.2f s, %.2f GB of weights in the files: %.1f GB/s (first load in the "
           "process%s: %.2f s)\n", load_s, info.weight_bytes / 1e9,
           info.weight_bytes / 1e9 / load_s, on_cuda ? ", with driver, context and pinned pool" :
           ", into memory new to it", first_s);
    print_load_path(m, load_s);
    /* the last load's steps (atlas_model_load_times), so that a slow one says which step */
    const atlas_model_load_times *lt = &info.times;
    printf("load steps  config %.1f ms, files %.1f, backend %.1f, weights %.1f (the read from "
           "%s), kv %.1f, the rest %.1f\n", lt->config - lt->begin, lt->files - lt->config,
           lt->backend - lt->files, lt->weights - lt->backend,
           info.load_source && *info.load_source ? info.load_source : "?",
           lt->kv - lt->weights, lt->end - lt->kv);
    if (on_cuda) print_load_reference(m, o.dir, info.weight_bytes / 1e9 / load_s);
    /* with --load-only only: its buffers (512 MiB) would count in a full run's peak RSS, which
     * bench/cpu/vs_llama.sh compares with llama.cpp's */
    if (!strcmp(info.backend, "cpu") && o.load_only)
        print_read_probe(o.dir, info.n_threads, info.weight_bytes / 1e9 / load_s,
                         info.weight_bytes / 1e9 / first_s, swaps);
    if (o.load_only) return atlas_model_release(m) == ATLAS_OK ? 0 : fail("releasing the model");

    int32_t *table = malloc(sizeof(int32_t) * max_blocks), *tokens = malloc(sizeof(int32_t) * ctx_max);
    for (int i = 0; i < max_blocks; i++) table[i] = i;
    for (int i = 0; i < ctx_max; i++) tokens[i] = (int32_t)((i * 2654435761u + 17u) % (unsigned)V);
    int32_t id = 0;
    double prefill_flops[MAX_P] = {0};
    for (int k = 0; k < o.n_p; k++) {
        int p = o.p[k];
        double t[16];
        int reps = o.reps < 16 ? o.reps : 16;
        /* the first prefill, timed too: for the first size it is a fresh process's first
         * request, which a user waits for and the warm runs would hide */
        double s0 = now_s(), c0 = cpu_s();
        if (forward_seq(m, tokens, 0, p, table, max_blocks, &id) != ATLAS_OK)
            return fail("prefill (the first)");
        double first = now_s() - s0, first_cpu = cpu_s() - c0, tc[16];
        for (int r = 0; r < reps; r++) {
            double s = now_s(), c = cpu_s();
            if (forward_seq(m, tokens, 0, p, table, max_blocks, &id) != ATLAS_OK)
                return fail("prefill");
            t[r] = now_s() - s;
            tc[r] = cpu_s() - c;
        }
        qsort(t, reps, sizeof *t, cmp_double);
        qsort(tc, reps, sizeof *tc, cmp_double);
        double ts = t[reps / 2];
        double flop = 2.0 * p * L * layer_w + 4.0 * H * hd * ((double)p * (p + 1) / 2) * L +
                      2.0 * d * V;
        prefill_flops[k] = flop / ts;
        printf("prefill     %5d tokens: %8.2f ms  %9.0f tok/s  %6.1f TFLOP/s (median of %d; "
               "the first%s: %.2f ms, %.0f tok/s, %.0f%% of the median's rate; CPU time %.3f s, "
               "the first %.3f s)\n", p, ts * 1e3, p / ts, flop / ts / 1e12, reps,
               k == 0 ? ", cold" : "", first * 1e3, p / first, 100.0 * ts / first,
               tc[reps / 2], first_cpu);
        /* FP8 weights in 128 x 128 blocks: the same with x rounded to e4m3 on the FP8
         * tensor cores (cuda_plan.fp8_act, off by default until measured), one warm-up */
        bool on = false;
        if (on_cuda && atlas_bench_fp8_act(m, true, NULL) == ATLAS_OK) {
            atlas_status st = forward_seq(m, tokens, 0, p, table, max_blocks, &id);
            for (int r = 0; r < reps && st == ATLAS_OK; r++) {
                double s = now_s();
                st = forward_seq(m, tokens, 0, p, table, max_blocks, &id);
                t[r] = now_s() - s;
            }
            atlas_bench_fp8_act(m, false, &on);
            if (st != ATLAS_OK) return fail("prefill with FP8 activations");
            qsort(t, reps, sizeof *t, cmp_double);
            printf("prefill fp8a %4d tokens: %8.2f ms  %9.0f tok/s (x in e4m3: %s; median of %d)"
                   "\n", p, t[reps / 2] * 1e3, p / t[reps / 2],
                   on ? "FP8 tensor cores" : "no FP8 matmul here, the scratch copy", reps);
        }
    }
    /* decode after a prefill of p[0] tokens: 4 warm-up steps each way (the first captures
     * its graph), then 3 timed runs each way in turn over the same positions, medians */
    int p0 = o.p[0];
    if (forward_seq(m, tokens, 0, p0, table, max_blocks, &id) != ATLAS_OK) return fail("prefill");
    int steps = o.n - 4 > 1 ? o.n - 4 : 1;
    double tq[3], ts[3], dt = 0;
    for (int r = -1; r < 3; r++)
        for (int queued = 0; queued < 2; queued++) {
            int32_t tok = id;
            if (decode_run(m, queued, r < 0 ? p0 : p0 + 4, r < 0 ? 4 : steps, table, max_blocks,
                           &tok, &dt) != ATLAS_OK)
                return fail(queued ? "decode (queued)" : "decode");
            if (r >= 0) (queued ? tq : ts)[r] = dt;
        }
    qsort(tq, 3, sizeof *tq, cmp_double);
    qsort(ts, 3, sizeof *ts, cmp_double);
    /* two ratios: plain steps (a forward_argmax a step: the server's scheduler) and queued
     * steps (atlas_model_forward_argmax_queue: atlas run's greedy generation) */
    dt = ts[1];
    double queued_dt = tq[1], decode_tps = steps / dt;
    /* the KV a step reads at the steps' mean context joins the weights in the denominator, as
     * the bytes a token reads are defined (issue 34): the cache as stored, every layer */
    double kv_tok = (double)info.kv_token_bytes * (p0 + 4 + (steps + 1) / 2.0);
    printf("decode      %d steps after %d tokens: %.3f ms/token, %.1f tok/s (%.2f GB of weights "
           "a token, %.3f GB of KV; runs %.3f %.3f %.3f)\n", steps, p0 + 4, dt / steps * 1e3,
           decode_tps, bytes_tok / 1e9, kv_tok / 1e9, ts[0] / steps * 1e3, ts[1] / steps * 1e3,
           ts[2] / steps * 1e3);
    bytes_tok += kv_tok;
    printf("decode q    the same steps queued a step ahead (each queued before the one before "
           "is collected): %.3f ms/token, %.1f tok/s (runs %.3f %.3f %.3f)\n",
           queued_dt / steps * 1e3, steps / queued_dt, tq[0] / steps * 1e3, tq[1] / steps * 1e3,
           tq[2] / steps * 1e3);
    /* INT4 weights: the same plain steps with x rounded to int8 for the one-row GEMVs (the
     * streaming kernel's dp4a form, `--gpu-activations int8`; off by default: it changes
     * results), one warm-up run */
    bool x8_was = false;
    if (on_cuda && atlas_bench_int8_x(m, true, &x8_was) == ATLAS_OK) {
        double tx[3];
        atlas_status st = plain_runs(m, id, p0, steps, table, max_blocks, tx);
        if (atlas_bench_int8_x(m, x8_was, NULL) != ATLAS_OK || st != ATLAS_OK)
            return fail("decode with int8 activations");
        printf("decode x8   the same plain steps with x in int8 for the INT4 GEMVs (dp4a): "
               "%.3f ms/token, %.1f tok/s (runs %.3f %.3f %.3f)\n", tx[1] / steps * 1e3,
               steps / tx[1], tx[0] / steps * 1e3, tx[1] / steps * 1e3, tx[2] / steps * 1e3);
    }
    for (int k = 0; k < o.n_batch; k++) {
        int B = o.batch[k];
        batch_run br, bs;
        if (decode_batch(m, B, p0, 4, steps, batch_blocks, V, NULL, &br) != ATLAS_OK)
            return fail("batched decode");
        printf("decode b%-4d  %d steps of %d sequences after %d tokens: %.3f ms/step, %.0f tok/s "
               "(steps %.3f / %.3f / %.3f ms quickest / median / slowest; graphs: %llu captured, "
               "%llu replayed)\n", B, steps, B, p0 + 4, br.dt / steps * 1e3,
               (double)B * steps / br.dt, br.step_min * 1e3, br.step_med * 1e3,
               br.step_max * 1e3, (unsigned long long)br.captured,
               (unsigned long long)br.replayed);
        /* the same steps sampled as bench/gpu/serve.sh's sampled workload asks: what the
         * sample op adds to a step of B rows */
        const atlas_sample_row draw = {.seed = 1, .temperature = 0.7f, .top_p = 0.95f,
                                       .repetition_penalty = 1.0f};
        if (decode_batch(m, B, p0, 4, steps, batch_blocks, V, &draw, &bs) != ATLAS_OK)
            return fail("batched decode, sampled");
        printf("decode b%-4d  the same steps sampled (temperature 0.7, top-p 0.95: the sample "
               "op): %.3f ms/step (median %.3f), %.2fx the greedy step's time\n", B,
               bs.dt / steps * 1e3, bs.step_med * 1e3, br.dt > 0 ? bs.dt / br.dt : 0.0);
    }

    atlas_bench_profile prof;
    if (atlas_bench_profile_decode(m, &prof) == ATLAS_OK) {
        printf("decode gpu  one graph replay %.3f ms (%d ops), host step %.3f ms: %.1f tok/s on the GPU "
               "alone\n", prof.graph_ms, prof.graph_nodes, dt / steps * 1e3,
               prof.graph_ms > 0 ? 1e3 / prof.graph_ms : 0.0);
        atlas_bench_cpu_info ci;
        if (atlas_bench_cpu_info_get(m, &ci) == ATLAS_OK)
            printf("host cpu    this thread on CPU %d (NUMA node %d); the GPU %s on node %d, its "
                   "local CPUs %s; this thread may run on %s\n", ci.cpu, ci.cpu_node, ci.pci,
                   ci.gpu_node, ci.gpu_cpus[0] ? ci.gpu_cpus : "(unknown)",
                   ci.allowed[0] ? ci.allowed : "(unknown)");
        for (int i = 0; i < ATLAS_BENCH_SHAPES; i++)
            printf("gemv        %-8s %6d x %-6d  n=1: block %4.0f GB/s   n=8: warp %4.0f  mma %4.0f "
                   "GB/s\n", prof.name[i], prof.m[i], prof.k[i], prof.gbps[0][i],
                   prof.gbps[1][i], prof.gbps[2][i]);
        for (int i = 0; prof.qfmt && i < 4; i++)
            printf("qmatmul     %-8s %6d x %-6d  %s/%d  n=1: %4.0f GB/s   n=8: split %4.0f (wide2 "
                   "%4.0f, wide4 %4.0f)   n=16: mma %4.0f  split "
                   "%4.0f (general %4.0f, wide2 %4.0f, wide4 %4.0f)  scratch %4.0f   n=32: mma "
                   "%4.0f  split %4.0f (general %4.0f)  scratch %4.0f   n=64: mma %4.0f  split "
                   "%4.0f  scratch %4.0f GB/s\n",
                   prof.name[i], prof.m[i], prof.k[i], prof.qfmt, prof.q_bc, prof.qgbps[0][i],
                   prof.qgbps[14][i], prof.qgbps[15][i], prof.qgbps[16][i], prof.qgbps[1][i],
                   prof.qgbps[7][i], prof.qgbps[10][i], prof.qgbps[12][i], prof.qgbps[13][i],
                   prof.qgbps[3][i],
                   prof.qgbps[5][i], prof.qgbps[8][i], prof.qgbps[11][i], prof.qgbps[6][i],
                   prof.qgbps[2][i], prof.qgbps[9][i], prof.qgbps[4][i]);
        for (int c = 0; prof.qfmt && c < 3; c++) {
            printf("qgemv graph %-8s %d in one graph, us each (GB/s):", prof.name[1 + c],
                   prof.qchain_len[c]);
            const char *vn[] = {"one-group", "x8", "s8", "s4", "sx8"};
            for (int v = 0; v < ATLAS_BENCH_QCHAINS; v++)
                printf("  %s %.2f (%.0f)", vn[v], prof.qchain_us[v][c],
                       prof.qchain_us[v][c] > 0 ? prof.qchain_bytes[c] / prof.qchain_us[v][c] / 1e3
                                                : 0.0);
            printf("\n");
        }
        for (int c = 0; c < 2; c++) {
            int i = prof.chain_shape[c];
            double mb = (double)prof.m[i] * prof.k[i] * 2 / 1e6;
            printf("gemv graph  %-8s %d in one graph, us each (GB/s):", prof.name[i], prof.chain_len[c]);
            const char *vn[] = {"block", "ng2", "ng4", "ng8", "w2", "w4"};
            for (int v = 0; v < ATLAS_BENCH_CHAINS; v++)
                printf("  %s %.1f (%.0f)", vn[v], prof.chain_us[v][c],
                       prof.chain_us[v][c] > 0 ? mb / prof.chain_us[v][c] * 1e3 : 0.0);
            printf("\n");
        }
    }
    atlas_bench_memory mem;
    if (atlas_bench_memory_get(m, &mem) == ATLAS_OK)
        printf("memory      weights %.2f GB, kv cache %.1f MB, workspace %.1f MB (total %.2f GB)\n",
               mem.weights / 1e9, mem.kv / 1e6, mem.workspace / 1e6, mem.total / 1e9);
    atlas_bench_ceilings cl;
    if (atlas_bench_ceilings_measure(m, (size_t)(o.read_gib * (1 << 30)), o.gemm, &cl) == ATLAS_OK) {
        double best = cl.lt_tflops > cl.own_tflops ? cl.lt_tflops : cl.own_tflops;
        const char *which = cl.lt_tflops > cl.own_tflops ? "cuBLASLt" : "atlas mma.sync";
        printf("device      %s\n", cl.device);
        printf("read bw     %.0f GB/s (16-byte loads over %.1f GiB, median)\n", cl.read_gbps,
               cl.read_bytes / (double)(1 << 30));
        if (cl.h2d_gbps > 0)
            printf("h2d bw      %.1f GB/s (pinned host to device, %.1f GiB copies, median)\n",
                   cl.h2d_gbps, cl.h2d_bytes / (double)(1 << 30));
        printf("matrix      bf16 %dx%dx%d: atlas mma.sync %.0f TFLOP/s, cuBLASLt %s %.0f TFLOP/s\n",
               cl.gemm_size, cl.gemm_size, cl.gemm_size, cl.own_tflops, cl.lt_version, cl.lt_tflops);
        printf("ratio       decode  %.1f%% of read bandwidth (%.0f GB/s of %.0f)\n",
               100.0 * decode_tps * bytes_tok / 1e9 / cl.read_gbps, decode_tps * bytes_tok / 1e9,
               cl.read_gbps);
        printf("ratio       decode q %.1f%% of read bandwidth (%.0f GB/s; steps queued a step ahead "
               "as atlas run generates greedily)\n",
               100.0 * steps / queued_dt * bytes_tok / 1e9 / cl.read_gbps,
               steps / queued_dt * bytes_tok / 1e9);
        for (int k = 0; k < o.n_p; k++)
            printf("ratio       prefill %d: %.1f%% of the matrix rate (%s, %.0f TFLOP/s)\n", o.p[k],
                   100.0 * prefill_flops[k] / 1e12 / best, which, best);
    } else {
        printf("ceilings    not measured: %s\n", atlas_last_error());
    }
    free(table);
    free(tokens);
    if (atlas_model_release(m) != ATLAS_OK) return fail("releasing the model");
    return 0;
}
