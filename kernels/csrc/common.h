/* Shared by the CPU kernels in this folder. */
#ifndef SPECDEC_COMMON_H
#define SPECDEC_COMMON_H

#include <math.h>
#include <stdint.h>

/* One variant per instruction set; the dynamic loader picks the best for this CPU. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SPECDEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECDEC_CLONES
#endif
/* exp(x), clamped to [-87, 88] (so always finite), in a form compilers vectorise:
 * 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, and a degree-7 Taylor polynomial
 * (relative error about 5e-9, below float32 rounding). */
static inline float exp_clamped(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = floorf(x * 1.44269504f + 0.5f);
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t bits; float value; } scale = {.bits = ((int32_t)n + 127) << 23};
    return p * scale.value;
}

/* 16-bit floats widened to float32 by integer shifts that vectorise on any x86: bfloat16
 * is float32's top half; float16's exponent is rebased by a multiply by 2^112, exact for
 * normal and subnormal values alike. */
static inline float widen_bf16(uint16_t bits) {
    union { uint32_t bits; float value; } v = {.bits = (uint32_t)bits << 16};
    return v.value;
}

static inline float widen_f16(uint16_t bits) {
    union { uint32_t bits; float value; } magnitude = {.bits = (uint32_t)(bits & 0x7fff) << 13};
    union { uint32_t bits; float value; } out = {.bits = 0};
    out.value = magnitude.value * 0x1p112f;
    out.bits |= (uint32_t)(bits & 0x8000) << 16;
    return out.value;
}

#endif
