/* cli/hints.c — what the commands that run a model say before and after a failed load: the
 * model directory checked first (a GGUF file, .bin weights or a hub id named with the path
 * the user gave), the model called by its directory's name, and --device cpu offered when
 * --device cuda finds no usable GPU. */
#include <stdio.h>
#include <string.h>

#include "atlas/host.h"
#include "atlas/model.h"
#include "cli/cli.h"

int atlas_cli_check_model(const char *cmd, const char *dir) {
    if (atlas_model_check_layout(dir) == ATLAS_OK) return 0;
    fprintf(stderr, "atlas %s: %s\n", cmd, atlas_last_error());
    return 1;
}

void atlas_cli_model_name(const char *dir, char *buf, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), dir + b);
    if (!buf[0]) snprintf(buf, cap, "%s", dir[0] ? dir : "model");
}

void atlas_cli_device_hint(const char *cmd, atlas_device device) {
    if (device != ATLAS_DEVICE_CUDA || !atlas_host_unavailable_reason()[0]) return;
    fprintf(stderr, "atlas %s: no usable CUDA driver or GPU here: --device cpu runs on the CPU "
            "(--device auto: CUDA where it is usable, else the CPU)\n", cmd);
}
