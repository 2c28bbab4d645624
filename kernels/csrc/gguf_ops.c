/* Linears and embedding rows over weights kept in llama.cpp's GGUF formats: Q8_0, Q4_0,
 * Q4_1, Q4_K, Q5_K, Q6_K (and F32 / F16 / BF16 rows, which GGUF files also hold).
 *
 * A GGUF matrix is row-major over output rows, each row a run of blocks along the input
 * (32 values a block, 256 for the K-quants). A linear dequantises one output row at a time
 * into a float32 buffer (exactly gguf.quants.dequantize's values: every product there is
 * exact in float32 or rounded once, the same way here) and dots it with every input row.
 *
 * Batch invariance: each input row's dot product with an output row runs in LANES lanes,
 * lane l summing the products at k = l, l + 32, l + 64, ... in increasing k, then one
 * fixed tree (lanes_sum) adds the lanes. Nothing in that order depends on how many input
 * rows come along or how they are tiled, so a row's result is the same bits alone, among
 * the K + 1 of a verify or in any batch. The vector paths (AVX-512, AVX2) compute the same
 * lanes with fused multiply-adds and give the same bits as each other; the portable path
 * rounds each product before its add.
 *
 * The caller (kernels/gguf_ops.py) checks shapes, types and byte counts; this file trusts
 * them. */
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


#define ISA(name) name##_portable
#define TILE 2
#define QUAD_OUTS 0
#include "gguf_isa.h"
#undef ISA
#undef TILE
#undef QUAD_OUTS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define ISA(name) name##_avx2
#define TILE 4
#define QUAD_OUTS 0
#include "gguf_isa.h"
#undef ISA
#undef TILE
#undef QUAD_OUTS
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")
#define ISA(name) name##_avx512
#define TILE 8
#define QUAD_OUTS 1
#include "gguf_isa.h"
#undef ISA
#undef TILE
#undef QUAD_OUTS
#pragma GCC pop_options
#endif

/* The instruction set the kernels use: 0 portable, 1 AVX2, 2 AVX-512; -1 until chosen. */
static int isa = -1;

static int best_isa(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return 1;
#endif
    return 0;
}

/* Pick the instruction set (requested: 0, 1, 2; -1 the best this CPU has). Returns the
 * one in effect: the request when the CPU has it, else the best it has. */
int specdec_gguf_set_isa(int requested) {
    const int best = best_isa();
    isa = requested < 0 || requested > best ? best : requested;
    return isa;
}

static specdec_task linear_task(void) {
    if (isa < 0) specdec_gguf_set_isa(-1);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (isa == 2) return linear_avx512;
    if (isa == 1) return linear_avx2;
#endif
    return linear_portable;
}

void specdec_linear_gguf(const float *x, int64_t ldx, const void *weight, const float *bias,
                         const float *residual, int64_t ldr, float *y, int64_t M, int K, int N) {
    struct gguf_linear_args a = {x, bias, residual, weight, y, ldx, ldr, M, K, N};
    specdec_parallel_for(N, linear_task(), &a);
}

/* Rows `ids[0..count)` of a [rows][K] GGUF matrix (an embedding), dequantised into
 * out[count][K]: only the rows read are touched. */
void specdec_gguf_rows(const struct specdec_gguf_weight *w, const int64_t *ids, int64_t count,
                       int K, float *out) {
    if (isa < 0) specdec_gguf_set_isa(-1);
    for (int64_t i = 0; i < count; ++i) {
        int64_t row = ids[i];
        int part = 0;
        while (row >= w->parts[part].rows) row -= w->parts[part++].rows;
        const struct specdec_gguf_part *p = &w->parts[part];
        const uint8_t *src = p->data + row * row_bytes(p->type, K);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
        if (isa == 2) {
            dequant_avx512(p->type, src, K, out + i * K);
            continue;
        }
        if (isa == 1) {
            dequant_avx2(p->type, src, K, out + i * K);
            continue;
        }
#endif
        dequant_portable(p->type, src, K, out + i * K);
    }
}
