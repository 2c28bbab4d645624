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
#include "gguf_common.h"

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
