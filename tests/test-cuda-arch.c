/* tests/test-cuda-arch.c — the CUDA backend's kernel choices by compute capability and shared
 * memory (backend/cuda/arch.c), for the GPUs atlas is built for, native and portable; and
 * the registry's portable switch through the fake driver (tests/fake_cuda.h). */
#include <string.h>

#include "backend/cuda/arch.h"
#include "backend/cuda/registry.h"
#include "fake_cuda.h"
#include "harness.h"

/* Device properties as the driver reports them (CUDA programming guide, per-architecture
 * shared memory: 227 KB a block and 228 KB an SM on sm_90, 163 / 164 on sm_80, 99 / 100 on
 * sm_86 and sm_89, 99 / 100 on sm_120). */
static atlas_host_props props(int major, int minor, int sms, int block_kb, int sm_kb) {
    atlas_host_props p = {.cc_major = major, .cc_minor = minor, .sm_count = sms,
                          .smem_per_block_optin = block_kb * 1024, .smem_per_sm = sm_kb * 1024};
    return p;
}

static void test_choices(void) {
    cuda_arch a;
    atlas_host_props h200 = props(9, 0, 132, 227, 228);
    cuda_arch_pick(&h200, false, false, &a);
    CHECK(a.clusters && a.pdl && !a.portable);
    CHECK(a.cc_major == 9 && a.cc_minor == 0);
    CHECK(a.attn_split_smem == 43 * 1024); /* the budget measured on the H200 */
    CHECK(a.attn_target_blocks == 528);
    cuda_arch_pick(&h200, false, true, &a); /* --no-pdl */
    CHECK(a.clusters && !a.pdl);

    /* portable on the H200: sm_86's choices and caps, the H200's SMs */
    cuda_arch_pick(&h200, true, false, &a);
    CHECK(a.portable && !a.clusters && !a.pdl);
    CHECK(a.cc_major == 8 && a.cc_minor == 6);
    CHECK(a.smem_block == 99 * 1024 && a.smem_sm == 100 * 1024);
    CHECK(a.attn_split_smem == 20 * 1024); /* 4 blocks (+4 KiB static, +1 KiB reserved) an SM */
    CHECK(a.attn_target_blocks == 528);

    /* an RTX 3090 natively: the same choices as portable mode on the H200 */
    atlas_host_props rtx = props(8, 6, 82, 99, 100);
    cuda_arch b;
    cuda_arch_pick(&rtx, false, false, &b);
    CHECK(!b.clusters && !b.pdl && !b.portable);
    CHECK(b.attn_split_smem == a.attn_split_smem && b.attn_target_blocks == 4 * 82);

    /* A100: more shared memory than sm_86, no clusters */
    atlas_host_props a100 = props(8, 0, 108, 163, 164);
    cuda_arch_pick(&a100, false, false, &b);
    CHECK(!b.clusters && b.attn_split_smem == 164 * 1024 / 4 - 5 * 1024);

    /* Blackwell and GB10: clusters and PDL, budgets from their shared memory */
    atlas_host_props gb10 = props(12, 1, 48, 99, 100);
    cuda_arch_pick(&gb10, false, false, &b);
    CHECK(b.clusters && b.pdl && b.attn_split_smem == 20 * 1024);
    atlas_host_props b200 = props(10, 0, 148, 227, 228);
    cuda_arch_pick(&b200, false, false, &b);
    CHECK(b.clusters && b.attn_split_smem == 43 * 1024 && b.attn_target_blocks == 592);

    /* what `atlas info` prints names the mode and the choices */
    char line[320];
    cuda_arch_describe(&a, &h200, line, (int)sizeof line);
    CHECK_MSG(strstr(line, "portable") && strstr(line, "sm_86") && strstr(line, "99 KB"), "%s",
              line);
    cuda_arch_pick(&h200, false, false, &a);
    cuda_arch_describe(&a, &h200, line, (int)sizeof line);
    CHECK_MSG(strstr(line, "native") && strstr(line, "clusters") && strstr(line, "cc 9.0"), "%s",
              line);
}

/* The registry's image kind is chosen before its first module and cannot change after. */
static void test_registry_portable(void) {
    CHECK_OK(fake_cuda_install(1));
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    CHECK(!atlas_registry_portable(r));
    CHECK_OK(atlas_registry_set_portable(r, true));
    CHECK(atlas_registry_portable(r));
    CHECK_OK(atlas_registry_load_image(r, "norm", "FAKEMOD:add_rmsnorm_bf16"));
    CHECK_OK(atlas_registry_set_portable(r, true)); /* the same kind: nothing changes */
    CHECK(atlas_registry_set_portable(r, false) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "1 module(s)") != NULL);
    CHECK(atlas_registry_portable(r));
    int count = 0;
    const atlas_kernel_image *img = atlas_kernel_images(&count);
    for (int i = 0; i < count; i++) /* a kernels build: each module has its PTX, NUL-ended */
        CHECK(img[i].ptx && img[i].ptx_size > 1 && img[i].ptx[img[i].ptx_size - 1] == 0 &&
              strstr((const char *)img[i].ptx, ".target sm_80"));
    CHECK_OK(atlas_registry_release(r));
}

int main(void) {
    test_choices();
    test_registry_portable();
    return harness_finish();
}
