/* cli/device.c — the --device and --kernels options, one spelling for every subcommand. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int atlas_cli_parse_device(const char *v, atlas_device *device, int *gpu) {
    if (!strcmp(v, "auto")) return *device = ATLAS_DEVICE_AUTO, *gpu = 0, 0;
    if (!strcmp(v, "cpu")) return *device = ATLAS_DEVICE_CPU, *gpu = 0, 0;
    if (strncmp(v, "cuda", 4)) return -1;
    if (!v[4]) return *device = ATLAS_DEVICE_CUDA, *gpu = 0, 0;
    if (v[4] != ':' || v[5] < '0' || v[5] > '9') return -1;
    char *end;
    errno = 0;
    long n = strtol(v + 5, &end, 10);
    if (errno || *end || n > 1023) return -1;
    *device = ATLAS_DEVICE_CUDA;
    *gpu = (int)n;
    return 0;
}

int atlas_cli_parse_kernels(const char *v, atlas_kernels *kernels) {
    if (!strcmp(v, "native")) return *kernels = ATLAS_KERNELS_NATIVE, 0;
    if (!strcmp(v, "portable")) return *kernels = ATLAS_KERNELS_PORTABLE, 0;
    return -1;
}
