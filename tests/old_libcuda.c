/* tests/old_libcuda.c — a stand-in libcuda.so whose driver supports only CUDA 11.2, older
 * than any toolkit atlas builds with: loaded through ATLAS_LIBCUDA by tests/server/
 * cli.test.mjs, which expects the error to name both versions. The one entry point atlas
 * calls before it checks the version. */
int cuDriverGetVersion(int *version);

int cuDriverGetVersion(int *version) {
    *version = 11020;
    return 0; /* CUDA_SUCCESS */
}
