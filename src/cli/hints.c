/* cli/hints.c — what the commands that run a model say before and after a failed load: the
 * model directory checked first (a GGUF file, .bin weights or a hub id named with the path
 * the user gave), the model called by its directory's name, and --device cpu offered when
 * --device cuda finds no usable GPU. */
#include <stdio.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/host.h"
#include "atlas/model.h"
#include "atlas/utf8.h"
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
    if (n == b) { /* "/" or "": the path itself */
        b = 0;
        n = strlen(dir);
    }
    /* the name must keep the engine's rule for model names, whatever bytes the directory's
     * name has: a run is not refused for the name of the folder it was given */
    atlas_utf8_clean(buf, cap < 128 ? cap : 128, dir + b, n - b);
    for (char *c = buf; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '_';
    if (!buf[0] || atlas_engine_check_name(buf) != ATLAS_OK) snprintf(buf, cap, "model");
}

void atlas_cli_device_hint(const char *cmd, atlas_device device) {
    if (device != ATLAS_DEVICE_CUDA || !atlas_host_unavailable_reason()[0]) return;
    fprintf(stderr, "atlas %s: no usable CUDA driver or GPU here: --device cpu runs on the CPU "
            "(--device auto: CUDA where it is usable, else the CPU)\n", cmd);
}
