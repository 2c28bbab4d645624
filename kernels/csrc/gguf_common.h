/* What gguf_ops.c (the exported GGUF kernels and their dispatch) and the per-ISA copies of
 * the GGUF linears (gguf_portable.c, gguf_avx2.c, gguf_avx512.c, each gguf_isa.h compiled
 * for its instruction set) share: GGML types, block layouts and the linear's arguments.
 * The copies are separate files so the build compiles them side by side (kernels/native.py):
 * each is one large, fully inlined kernel and takes most of the library's build time. */
#ifndef SPECDEC_GGUF_COMMON_H
#define SPECDEC_GGUF_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ops.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

/* GGML type ids (ggml.h's enum ggml_type; gguf.GGMLQuantizationType). */
enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30,
};

#define TILE_ROWS 8 /* input rows sharing one pass over a dequantised output row */
/* Rows ahead / outs (the Q4_1 target at 1 thread: 0 passes 46, 1 70, 2 74, 4 78, 8 78 tok/s) */
#define PREFETCH_PASSES 4
#define PAIR_ROWS 4 /* up to this many input rows, two output rows a pass */
/* Up to this many, four output rows a pass where the ISA's registers hold their sums
 * (QUAD_OUTS; AVX-512): the Q4_1 target's decode 7-14 % faster than two a pass */
#define QUAD_ROWS 2
#define MAX_OUTS 4
#define QK_K 256
/* Q8_0 / Q4_0 / Q4_1 blocks whose scales are widened ahead of a pass (block_scales; a
 * multiple of the 16 one gather reads), and the most floats one keeps there (d, and m for
 * Q4_1: scales_per_block) */
#define SCALE_BLOCKS 64
#define SCALES_PER_BLOCK 2

static inline float f16_to_f32(const uint8_t *p) {
    uint16_t bits;
    memcpy(&bits, p, 2);
    return widen_f16(bits);
}

/* ---- 32 values at a time, as gguf.quants dequantizes them ---------------------------------
 * GCC vector types: 16 floats are one AVX-512 register, two AVX2 ones, four SSE ones; each
 * ISA's copy of the code below is compiled for its registers, lane for lane the same. */
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

/* Q4_K / Q5_K: eight 6-bit (scale, min) pairs packed in 12 bytes. */
static inline void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Bytes of one output row of K values in `type`. */
static inline int64_t row_bytes(int type, int K) {
    switch (type) {
    case GGML_F32: return (int64_t)K * 4;
    case GGML_F16:
    case GGML_BF16: return (int64_t)K * 2;
    case GGML_Q8_0: return (int64_t)K / 32 * 34;
    case GGML_Q4_0: return (int64_t)K / 32 * 18;
    case GGML_Q4_1: return (int64_t)K / 32 * 20;
    case GGML_Q4_K: return (int64_t)K / QK_K * 144;
    case GGML_Q5_K: return (int64_t)K / QK_K * 176;
    default: return (int64_t)K / QK_K * 210; /* Q6_K */
    }
}

static inline int has_block_scales(int type) {
    return type == GGML_Q8_0 || type == GGML_Q4_0 || type == GGML_Q4_1;
}

static inline int scales_per_block(int type) {
    return type == GGML_Q4_1 ? 2 : 1;
}

static inline int is_float_type(int type) {
    return type == GGML_F32 || type == GGML_F16 || type == GGML_BF16;
}

/* One output row in one part of a weight: its first output column and its bytes. */
struct gguf_linear_args {
    const float *x, *bias, *residual;
    const struct specdec_gguf_weight *w;
    float *y;
    int64_t ldx, ldr, M;
    int K, N;
};

/* Each ISA's copy (ISA(linear), ISA(dequant) in gguf_isa.h), named by its suffix. */
#define GGUF_ISA_DECLARE(suffix)                                                                 \
    __attribute__((visibility("hidden"))) void linear_##suffix(void *ctx, int64_t first,         \
                                                               int64_t end);                     \
    __attribute__((visibility("hidden"))) void dequant_##suffix(int type, const uint8_t *row,    \
                                                                int K, float *out);
GGUF_ISA_DECLARE(portable)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
GGUF_ISA_DECLARE(avx2)
GGUF_ISA_DECLARE(avx512)
#endif
#undef GGUF_ISA_DECLARE

#endif
