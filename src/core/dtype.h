/* core/dtype.h — element types of tensors in files and on devices, and conversions.  Internal. */
#ifndef ATLAS_CORE_DTYPE_H
#define ATLAS_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum atlas_dtype {
    ATLAS_DTYPE_F32 = 0,
    ATLAS_DTYPE_F16,
    ATLAS_DTYPE_BF16,
    ATLAS_DTYPE_I32,
    ATLAS_DTYPE_I64,
    ATLAS_DTYPE_U8,
    ATLAS_DTYPE_F8_E4M3, /* OCP FP8 e4m3 ("fn": no infinities, NaN 0x7F / 0xFF) */
    ATLAS_DTYPE_COUNT
} atlas_dtype;

static inline size_t atlas_dtype_size(atlas_dtype t) {
    switch (t) {
    case ATLAS_DTYPE_F32: case ATLAS_DTYPE_I32: return 4;
    case ATLAS_DTYPE_F16: case ATLAS_DTYPE_BF16: return 2;
    case ATLAS_DTYPE_I64: return 8;
    case ATLAS_DTYPE_U8: case ATLAS_DTYPE_F8_E4M3: return 1;
    default: return 0;
    }
}

/* "F32", "BF16", ... (the safetensors spelling). */
static inline const char *atlas_dtype_name(atlas_dtype t) {
    static const char *const names[] = {"F32", "F16", "BF16", "I32", "I64", "U8", "F8_E4M3"};
    return (unsigned)t < ATLAS_DTYPE_COUNT ? names[t] : "?";
}

static inline float atlas_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t atlas_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float atlas_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* An OCP FP8 e4m3 code (bias 7, 3 mantissa bits, subnormals below 2^-6, no infinities:
 * S.1111.111 is NaN and S.1111.110 = 448 the largest) as float32; exact. */
static inline float atlas_e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, exp = (c >> 3) & 0xfu, man = c & 0x7u, u;
    if (exp == 0xf && man == 0x7) {
        u = sign | 0x7fc00000u;
    } else if (exp == 0) { /* subnormal: man / 8 * 2^-6, a float32 normal */
        float f = (float)man * 0.001953125f; /* 2^-9 */
        return sign ? -f : f;
    } else {
        u = sign | ((exp + 127 - 7) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 as the nearest OCP FP8 e4m3 code (ties to even), saturating: anything of magnitude
 * 448 or more, infinities included, becomes +-448; NaN becomes NaN (S.1111.111). What CUDA's
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and vLLM's FP8 KV cache write. */
static inline uint8_t atlas_f32_to_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    if (a >= 0x43e00000u) return sign | 0x7eu; /* 448 */
    if (a < 0x3c800000u) { /* under 2^-6: a subnormal, a multiple m of 2^-9 (m = 8 is 2^-6) */
        float x;
        memcpy(&x, &a, 4);
        x *= 512.0f; /* exact: a power of two */
        uint32_t m = (uint32_t)x;
        float rem = x - (float)m; /* exact: x < 8 */
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return sign | (uint8_t)m;
    }
    /* normal: the exponent and the top 3 mantissa bits, rounded at bit 20 to even */
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    uint32_t code = r - ((127u - 7u) << 3);
    return sign | (uint8_t)(code > 0x7eu ? 0x7eu : code);
}

/* An OCP FP4 e2m1 code (the low 4 bits: sign, 2 exponent bits with bias 1, 1 mantissa bit;
 * no infinities or NaN): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; exact. */
static inline float atlas_e2m1_to_f32(uint8_t c) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float f = mag[c & 7u];
    return c & 8u ? -f : f;
}

/* An OCP e8m0 scale code (MX formats): 2^(c - 127); 0xFF is NaN; exact (2^-127 is a
 * float32 subnormal). */
static inline float atlas_e8m0_to_f32(uint8_t c) {
    uint32_t u = c == 0xff ? 0x7fc00000u : c == 0 ? 0x00400000u : (uint32_t)c << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
