/* tests/test-host.c — the process host without a GPU: the normal case on CI and laptops.
 * Each scenario runs in a child process, since the host binds (or fails) once per process:
 * the real default (libcuda.so.1, whatever this machine has), a path that does not exist,
 * and a real library that is not a CUDA driver. */
#include <stdlib.h>
#include <string.h>

#include "atlas/host.h"
#include "backend/cuda/driver.h"
#include "harness.h"

/* The machine's own driver: here usually none (a clear error); on a GPU machine a host. */
static void scenario_default(void) {
    unsetenv("ATLAS_LIBCUDA");
    atlas_host *h = NULL;
    atlas_status st = atlas_host_get(0, &h);
    if (st == ATLAS_OK) {
        const atlas_host_props *p = atlas_host_properties(h);
        printf("host: %s, cc %d.%d, %d SMs, %zu MiB, driver %d, init %.1f ms\n", p->name,
               p->cc_major, p->cc_minor, p->sm_count, p->total_mem >> 20, p->driver_version,
               p->init_ms);
        CHECK(p->sm_count > 0 && p->total_mem > 0 && p->cc_major >= 5);
        CHECK(strcmp(atlas_host_unavailable_reason(), "") == 0);
        return;
    }
    printf("no host: %s\n", atlas_last_error());
    CHECK(st == ATLAS_ERR_NO_DEVICE);
    CHECK(h == NULL);
    CHECK(atlas_last_error()[0] != '\0');
    CHECK(strcmp(atlas_host_unavailable_reason(), atlas_last_error()) == 0);
    CHECK(atlas_driver_get() == NULL);
}

static void scenario_missing(void) {
    const char *path = "/nonexistent/atlas-test/libcuda.so.1";
    setenv("ATLAS_LIBCUDA", path, 1);
    CHECK(strcmp(atlas_host_unavailable_reason(), "") == 0);
    atlas_host *h = (atlas_host *)&h; /* must be reset to NULL */
    atlas_status st = atlas_host_get(0, &h);
    CHECK(st == ATLAS_ERR_NO_DEVICE);
    CHECK(h == NULL);
    /* the dlerror text: the path and why */
    CHECK_MSG(strstr(atlas_last_error(), path) != NULL, "%s", atlas_last_error());
    CHECK_MSG(strstr(atlas_last_error(), "No such file") != NULL, "%s", atlas_last_error());
    const char *reason = atlas_host_unavailable_reason();
    CHECK_MSG(strstr(reason, path) != NULL, "reason: %s", reason);

    /* the failure is kept: a second call says the same, without retrying the load */
    atlas_error_clear();
    CHECK(atlas_host_get(0, &h) == ATLAS_ERR_NO_DEVICE);
    CHECK_MSG(strstr(atlas_last_error(), path) != NULL, "%s", atlas_last_error());
    CHECK(atlas_host_get(3, &h) == ATLAS_ERR_NO_DEVICE);
    CHECK(atlas_driver_version() == 0);
    const atlas_driver *d = (const atlas_driver *)&d;
    CHECK(atlas_driver_load(&d) == ATLAS_ERR_NO_DEVICE && d == NULL);

    /* too late for a fake: the driver's one load was attempted */
    atlas_driver fake;
    memset(&fake, 0, sizeof fake);
    CHECK(atlas_driver_install_for_test(&fake, 13000) == ATLAS_ERR_INVALID);

    /* bad arguments are the caller's error, not a missing device */
    CHECK(atlas_host_get(-1, &h) == ATLAS_ERR_INVALID);
}

/* A real shared library that is not a CUDA driver. */
static void scenario_not_a_driver(void) {
    setenv("ATLAS_LIBCUDA", "libm.so.6", 1);
    atlas_host *h = NULL;
    CHECK(atlas_host_get(0, &h) == ATLAS_ERR_NO_DEVICE);
    CHECK_MSG(strstr(atlas_last_error(), "cuDriverGetVersion") != NULL, "%s",
              atlas_last_error());
    CHECK_MSG(strstr(atlas_host_unavailable_reason(), "not a CUDA driver") != NULL, "%s",
              atlas_host_unavailable_reason());
}

/* atlas_host_start with no driver: the set-up fails on its thread, and the next
 * atlas_host_get says why on the caller's, as without it. */
static void scenario_start_missing(void) {
    const char *path = "/nonexistent/atlas-test/libcuda.so.1";
    setenv("ATLAS_LIBCUDA", path, 1);
    atlas_host_start(0);
    atlas_host *h = (atlas_host *)&h;
    atlas_status st = atlas_host_get(0, &h);
    CHECK(st == ATLAS_ERR_NO_DEVICE && h == NULL);
    CHECK_MSG(strstr(atlas_last_error(), path) != NULL, "%s", atlas_last_error());
    atlas_host_times t;
    atlas_host_get_times(&t);
    CHECK(t.begin > 0 && t.context == 0 && t.streams == 0 && t.staging == 0);
    atlas_host_start_wait(); /* both threads end: no driver, so no cuBLASLt either */
    atlas_host_get_times(&t);
    CHECK(t.cublaslt == 0 && t.driver == 0);
}

int main(void) {
    harness_in_child("default driver", scenario_default);
    harness_in_child("missing library", scenario_missing);
    harness_in_child("not a driver", scenario_not_a_driver);
    harness_in_child("started with a missing library", scenario_start_missing);

    /* atlas_cu_check without a driver: still names the call, the code and where */
    atlas_status st = atlas_cu_check(2, "cuMemAlloc", __FILE__, __LINE__);
    CHECK(st == ATLAS_ERR_DEVICE_NOMEM);
    CHECK_MSG(strstr(atlas_last_error(), "cuMemAlloc failed: CUDA_ERROR_2 (tests/test-host.c:")
              != NULL, "%s", atlas_last_error());
    CHECK(atlas_cu_check(0, "cuInit", __FILE__, __LINE__) == ATLAS_OK);
    CHECK(atlas_cu_check(700, "cuCtxSynchronize", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    return harness_finish();
}
