/* The elementwise parts of a Llama / Qwen3 layer on the CPU, float32, one call each
 * (and the KV cache's row copy).
 *
 * Each replaces several eager PyTorch ops (RMSNorm is six of them) whose per-op cost, not
 * their arithmetic, dominates at decode batch sizes. Rows are contiguous; the caller
 * (kernels/dense_ops.py) checks shapes and dtypes; this file trusts them.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#include "common.h"

/* Inverse RMS of one row: 1 / sqrt(mean(x^2) + eps). The sum runs in double, so its
 * float32 result does not depend on the vector width the CPU's variant sums in. */
static inline float inv_rms(const float *restrict x, int dim, float eps) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < dim; ++d) sum += (double)x[d] * x[d];
    return 1.0f / sqrtf((float)(sum / dim) + eps);
}

/* out[r] = x[r] * inv_rms(x[r]) * weight, for `rows` rows of `dim` (row strides given). */
SPECDEC_CLONES
void specdec_rms_norm(const float *x, int64_t x_stride, const float *weight, float eps,
                      float *out, int64_t out_stride, int64_t rows, int dim) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *restrict xr = x + r * x_stride;
        float *restrict o = out + r * out_stride;
        const float scale = inv_rms(xr, dim, eps);
#pragma omp simd
        for (int d = 0; d < dim; ++d) o[d] = xr[d] * scale * weight[d];
    }
}

/* In place on the first `heads` heads of each token's row of `qkv` (q heads, then k
 * heads): optional per-head RMSNorm (Qwen3's q_norm / k_norm; `norm_weight` is
 * [heads][head_dim] or NULL), then RoPE in the rotate-half convention,
 * x * cos + roll(x, head_dim / 2) * sin_signed, from [positions][head_dim] tables. */
SPECDEC_CLONES
void specdec_qk_norm_rope(float *qkv, int64_t tokens, int64_t token_stride, int heads,
                          int head_dim, const float *norm_weight, float eps,
                          const float *cos_table, const float *sin_signed_table,
                          const int64_t *positions) {
    const int half = head_dim / 2;
    float rotated[512];
    for (int64_t t = 0; t < tokens; ++t) {
        const float *restrict cos = cos_table + positions[t] * head_dim;
        const float *restrict sin = sin_signed_table + positions[t] * head_dim;
        for (int h = 0; h < heads; ++h) {
            float *restrict x = qkv + t * token_stride + (int64_t)h * head_dim;
            if (norm_weight != NULL) {
                const float scale = inv_rms(x, head_dim, eps);
                const float *restrict w = norm_weight + (int64_t)h * head_dim;
#pragma omp simd
                for (int d = 0; d < head_dim; ++d) x[d] = x[d] * scale * w[d];
            }
#pragma omp simd
            for (int d = 0; d < half; ++d) {
                rotated[d] = x[d] * cos[d] + x[d + half] * sin[d];
                rotated[d + half] = x[d + half] * cos[d + half] + x[d] * sin[d + half];
            }
#pragma omp simd
            for (int d = 0; d < head_dim; ++d) x[d] = rotated[d];
        }
    }
}

/* out[t] = silu(gate_up[t][:inter]) * gate_up[t][inter:], silu(g) = g / (1 + exp(-g)). */
SPECDEC_CLONES
void specdec_silu_and_mul(const float *gate_up, int64_t tokens, int inter, float *out) {
    for (int64_t t = 0; t < tokens; ++t) {
        const float *restrict g = gate_up + t * 2 * (int64_t)inter;
        const float *restrict u = g + inter;
        float *restrict o = out + t * (int64_t)inter;
#pragma omp simd
        for (int i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + exp_clamped(-g[i])) * u[i];
    }
}

/* KV cache write for a float32 layer viewed as rows of `row_size` floats: token t's K
 * row goes to rows[t], its V row to rows[tokens + t]. */
void specdec_write_kv(float *layer, const int64_t *rows, const float *k, int64_t k_stride,
                      const float *v, int64_t v_stride, int64_t tokens, int row_size) {
    const size_t bytes = sizeof(float) * (size_t)row_size;
    for (int64_t t = 0; t < tokens; ++t) {
        memcpy(layer + rows[t] * row_size, k + t * k_stride, bytes);
        memcpy(layer + rows[tokens + t] * row_size, v + t * v_stride, bytes);
    }
}

/* ---- linear ----------------------------------------------------------------------------
 * y = x @ W (+ bias) (+ residual), with W packed as [N / LINEAR_COLS][K][LINEAR_COLS]:
 * each block of columns is one contiguous stream (K x 32 floats, L2-sized), read from
 * memory once and then from cache for every tile of rows, whose partial sums stay in
 * registers (4 x 32 floats in 16 AVX2 registers; 8 x 32 in 16 of AVX-512's 32). At decode and verify sizes this
 * streams the weights at close to memory bandwidth, where a general GEMM repacks them
 * every call.
 *
 * Batch invariance: every output element is one sum over k in order, whatever M is and
 * whichever tile the row falls in, so a token's result does not depend on the rows beside
 * it. A token decoded alone, verified with proposals, or prefilled in a chunk gets the
 * same bits; with an FP8 KV cache, where a last-bit difference can round a K or V entry
 * to the next FP8 value, this is what keeps speculative greedy output equal to
 * target-only output. */
#define LINEAR_COLS 32
#define LINEAR_ROWS 4
#define LINEAR_ROWS_WIDE 8 /* with 32 vector registers (AVX-512): one pass for a verify */
/* Rows of a block ahead (8 KB), prefetched into L2 (prefetcht1) rather than L1: with
 * the L1 target a 7-row verify tile stalled on its prefetches and streamed at half the
 * 1-row rate. Measured one thread, float32: a 7-token verify of the bundled target
 * 6.3-6.4 -> 5.1-5.7 ms, of SmolLM2-135M 52-54 -> 47-48 ms; batch-8 decode of the
 * bundled target 1,100-1,140 -> 1,240-1,470 tok/s; batch 1 unchanged. The 16-bit tiles
 * below gained nothing from it (they widen every row, so stall less) and keep L1. */
#define LINEAR_PREFETCH 64
#define LINEAR_PREFETCH_L2 2 /* __builtin_prefetch's locality for prefetcht1 */
/* Rows ahead (1 KB) that the block is also prefetched into L1 from L2, so the tile's loads
 * find it there: a 7-token verify of SmolLM2-135M (weights from DRAM) 46.5-47.0 -> 43.8-45.4
 * ms; the bundled target (weights mostly in L3) unchanged. */
#define LINEAR_PREFETCH_L1 8
#define LINEAR_DEPTH 64     /* products per partial sum */

static inline __attribute__((always_inline)) void linear_tile(
    const int rows, const float *restrict x, int64_t ldx, const float *restrict block,
    const float *bias, const float *residual, int64_t ldr, float *restrict y, int64_t ldy,
    int K) {
    /* The running totals live in y itself: only the partial sums below need registers
     * (8 x 32 floats: 16 of AVX-512's 32), so none spill at 8 rows. */
    for (int m = 0; m < rows; ++m)
        for (int n = 0; n < LINEAR_COLS; ++n)
            y[m * ldy + n] = (residual ? residual[m * ldr + n] : 0.0f) + (bias ? bias[n] : 0.0f);
    /* Sums of LINEAR_DEPTH products at a time, added to the total: float32 rounding then
     * grows with K / LINEAR_DEPTH + LINEAR_DEPTH terms rather than K, as in a GEMM that
     * blocks K (logits stay within 1e-4 of MKL's over a 30-layer model). */
    for (int k0 = 0; k0 < K; k0 += LINEAR_DEPTH) {
        const int k1 = K - k0 < LINEAR_DEPTH ? K : k0 + LINEAR_DEPTH;
        float part[LINEAR_ROWS_WIDE][LINEAR_COLS];
        for (int m = 0; m < rows; ++m)
            for (int n = 0; n < LINEAR_COLS; ++n) part[m][n] = 0.0f;
        for (int k = k0; k < k1; ++k) {
            const float *restrict w = block + (int64_t)k * LINEAR_COLS;
            __builtin_prefetch(w + LINEAR_PREFETCH * LINEAR_COLS, 0, LINEAR_PREFETCH_L2);
            __builtin_prefetch(w + LINEAR_PREFETCH * LINEAR_COLS + 16, 0, LINEAR_PREFETCH_L2);
            __builtin_prefetch(w + LINEAR_PREFETCH_L1 * LINEAR_COLS);
            __builtin_prefetch(w + LINEAR_PREFETCH_L1 * LINEAR_COLS + 16);
            for (int m = 0; m < rows; ++m) {
                const float xv = x[m * ldx + k];
#pragma omp simd
                for (int n = 0; n < LINEAR_COLS; ++n) part[m][n] += xv * w[n];
            }
        }
        for (int m = 0; m < rows; ++m)
#pragma omp simd
            for (int n = 0; n < LINEAR_COLS; ++n) y[m * ldy + n] += part[m][n];
    }
}

/* Everything a linear's column blocks need: one share of them per pool thread. */
struct linear_args {
    const float *x, *bias, *residual;
    const void *packed;
    float *y;
    int64_t ldx, ldr, M;
    int K, N;
};

/* Every row tile of the column block at n0, whose float32 weights are `block`. */
/* Rows per tile: LINEAR_ROWS_WIDE where the CPU has 32 vector registers for the sums
 * (its clone of linear_rows then holds 8 x 32 floats in 16 of them), so a verify step's
 * rows share one pass over the weights and the compute overlaps their streaming. */
static int tile_rows(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    static int rows;
    if (rows == 0)
        rows = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
                   ? LINEAR_ROWS_WIDE
                   : LINEAR_ROWS;
    return rows;
#else
    return LINEAR_ROWS;
#endif
}

/* Every row tile of the column block at n0, whose float32 weights are `block`. */
SPECDEC_CLONES
static void linear_rows(const struct linear_args *a, const float *block, int64_t n0) {
    const int K = a->K, N = a->N, tile = tile_rows();
    for (int64_t m0 = 0; m0 < a->M; m0 += tile) {
        const int64_t rows = a->M - m0 < tile ? a->M - m0 : tile;
        const float *xr = a->x + m0 * a->ldx;
        const float *b = a->bias ? a->bias + n0 : NULL;
        const float *res = a->residual ? a->residual + m0 * a->ldr + n0 : NULL;
        float *yr = a->y + m0 * N + n0;
        const int64_t ldx = a->ldx, ldr = a->ldr;
        /* Constant row counts, so each tile's sums live in registers. */
        switch (rows) {
        case 8: linear_tile(8, xr, ldx, block, b, res, ldr, yr, N, K); break;
        case 7: linear_tile(7, xr, ldx, block, b, res, ldr, yr, N, K); break;
        case 6: linear_tile(6, xr, ldx, block, b, res, ldr, yr, N, K); break;
        case 5: linear_tile(5, xr, ldx, block, b, res, ldr, yr, N, K); break;
        case 4: linear_tile(4, xr, ldx, block, b, res, ldr, yr, N, K); break;
        case 3: linear_tile(3, xr, ldx, block, b, res, ldr, yr, N, K); break;
        case 2: linear_tile(2, xr, ldx, block, b, res, ldr, yr, N, K); break;
        default: linear_tile(1, xr, ldx, block, b, res, ldr, yr, N, K); break;
        }
    }
}

static void linear_blocks(void *ctx, int64_t first, int64_t end) {
    const struct linear_args *a = ctx;
    for (int64_t n0 = first * LINEAR_COLS; n0 < end * LINEAR_COLS; n0 += LINEAR_COLS)
        linear_rows(a, (const float *)a->packed + n0 * a->K, n0);
}

void specdec_linear(const float *x, int64_t ldx, const float *packed, const float *bias,
                    const float *residual, int64_t ldr, float *y, int64_t M, int K, int N) {
    struct linear_args a = {x, bias, residual, packed, y, ldx, ldr, M, K, N};
    specdec_parallel_for(N / LINEAR_COLS, linear_blocks, &a);
}

/* The same linear over 16-bit weights (bfloat16 or IEEE float16), packed alike: a block's
 * rows are widened to float32 (inside each tile, or for prefill-sized batches once into a
 * buffer the float32 tiles then read, which keeps the widening out of their registers),
 * then multiplied and summed exactly as above, so the products and sums are those of specdec_linear over the widened weights (batch
 * invariant too). Half the bytes per decode step. Both widenings are integer shifts that
 * vectorise on any x86 (common.h's widen_bf16 / widen_f16). */
/* From this many rows on, a block is widened once for all its tiles (measured on the
 * bundled target: slower than widening in every tile up to 12 rows, where the weights
 * stream from memory during the first tile; 1.4x faster at 96). */
#define WIDEN_ONCE_ROWS 16


/* The tiles and the column-block task of a linear over narrower weights (WTYPE, widened
 * to float32 by WIDEN, TILE rows a tile); SCALED: each block ends with its columns' float32
 * scales, which multiply every partial sum (int8, below). */
#define LINEAR_NARROW(SUFFIX, ATTRIBUTES, TARGET, WTYPE, WIDEN, TILE, SCALED)                    \
    static inline __attribute__((always_inline)) TARGET void linear_tile_##SUFFIX(               \
        const int rows, const float *restrict x, int64_t ldx, const WTYPE *restrict block,       \
        const float *restrict scale, const float *bias, const float *residual, int64_t ldr,      \
        float *restrict y, int64_t ldy, int K) {                                                 \
        for (int m = 0; m < rows; ++m)                                                           \
            for (int n = 0; n < LINEAR_COLS; ++n)                                                \
                y[m * ldy + n] =                                                                 \
                    (residual ? residual[m * ldr + n] : 0.0f) + (bias ? bias[n] : 0.0f);         \
        for (int k0 = 0; k0 < K; k0 += LINEAR_DEPTH) {                                           \
            const int k1 = K - k0 < LINEAR_DEPTH ? K : k0 + LINEAR_DEPTH;                        \
            float part[LINEAR_ROWS_WIDE][LINEAR_COLS] = {{0.0f}};                                \
            for (int k = k0; k < k1; ++k) {                                                      \
                const WTYPE *restrict wn = block + (int64_t)k * LINEAR_COLS;                     \
                /* As many bytes ahead as float32's 2 x LINEAR_PREFETCH rows. */                 \
                __builtin_prefetch(wn + 4 / sizeof(WTYPE) * LINEAR_PREFETCH * LINEAR_COLS);      \
                float w[LINEAR_COLS];                                                            \
                WIDEN(wn, w);                                                                    \
                for (int m = 0; m < rows; ++m) {                                                 \
                    const float xv = x[m * ldx + k];                                             \
                    _Pragma("omp simd") for (int n = 0; n < LINEAR_COLS; ++n)                    \
                        part[m][n] += xv * w[n];                                                 \
                }                                                                                \
            }                                                                                    \
            for (int m = 0; m < rows; ++m)                                                       \
                _Pragma("omp simd") for (int n = 0; n < LINEAR_COLS; ++n)                        \
                    y[m * ldy + n] += SCALED ? part[m][n] * scale[n] : part[m][n];               \
        }                                                                                        \
    }                                                                                            \
    ATTRIBUTES TARGET                                                                            \
    void linear_blocks_##SUFFIX(void *ctx, int64_t first, int64_t end) {                         \
        const struct linear_args *a = ctx;                                                       \
        const int K = a->K, N = a->N, tile = (TILE);                                             \
        /* A block's weights, then (SCALED) its LINEAR_COLS float32 scales. */                   \
        const int64_t stride =                                                                   \
            (int64_t)K * LINEAR_COLS + (SCALED ? LINEAR_COLS * sizeof(float) / sizeof(WTYPE) : 0); \
        float *wide = !SCALED && a->M >= WIDEN_ONCE_ROWS                                         \
                          ? specdec_scratch((size_t)K * LINEAR_COLS)                             \
                          : NULL;                                                                \
        for (int64_t n0 = first * LINEAR_COLS; n0 < end * LINEAR_COLS; n0 += LINEAR_COLS) {      \
            const WTYPE *block = (const WTYPE *)a->packed + n0 / LINEAR_COLS * stride;           \
            const float *sc = SCALED ? (const float *)(block + (int64_t)K * LINEAR_COLS)         \
                                     : NULL;                                                     \
            if (wide) {                                                                          \
                for (int k = 0; k < K; ++k)                                                      \
                    WIDEN(block + (int64_t)k * LINEAR_COLS, wide + (int64_t)k * LINEAR_COLS);    \
                linear_rows(a, wide, n0);                                                        \
                continue;                                                                        \
            }                                                                                    \
            for (int64_t m0 = 0; m0 < a->M; m0 += tile) {                                        \
                const int64_t rows = a->M - m0 < tile ? a->M - m0 : tile;                        \
                const float *xr = a->x + m0 * a->ldx;                                            \
                const float *b = a->bias ? a->bias + n0 : NULL;                                  \
                const float *res = a->residual ? a->residual + m0 * a->ldr + n0 : NULL;          \
                float *yr = a->y + m0 * N + n0;                                                  \
                const int64_t ldx = a->ldx, ldr = a->ldr;                                        \
                switch (rows) {                                                                  \
                case 8: linear_tile_##SUFFIX(8, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                case 7: linear_tile_##SUFFIX(7, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                case 6: linear_tile_##SUFFIX(6, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                case 5: linear_tile_##SUFFIX(5, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                case 4: linear_tile_##SUFFIX(4, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                case 3: linear_tile_##SUFFIX(3, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                case 2: linear_tile_##SUFFIX(2, xr, ldx, block, sc, b, res, ldr, yr, N, K); break; \
                default: linear_tile_##SUFFIX(1, xr, ldx, block, sc, b, res, ldr, yr, N, K);  \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

#define WIDEN_ROW(WIDEN_ONE)                                                                     \
    (const uint16_t *restrict in, float *restrict out) {                                        \
        for (int n = 0; n < LINEAR_COLS; ++n) out[n] = WIDEN_ONE(in[n]);                        \
    }
static inline __attribute__((always_inline)) void widen_row_bf16 WIDEN_ROW(widen_bf16)
static inline __attribute__((always_inline)) void widen_row_f16 WIDEN_ROW(widen_f16)

LINEAR_NARROW(bf16, static SPECDEC_CLONES, , uint16_t, widen_row_bf16, tile_rows(), 0)
LINEAR_NARROW(f16_generic, static, , uint16_t, widen_row_f16, LINEAR_ROWS, 0)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
/* float16 widened by F16C (x86-64-v3 and up), four instructions a row. */
#define F16C __attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) F16C void widen_row_f16c(
    const uint16_t *restrict in, float *restrict out) {
    for (int n = 0; n < LINEAR_COLS; n += 8)
        _mm256_storeu_ps(out + n, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + n))));
}
LINEAR_NARROW(f16c, static, F16C, uint16_t, widen_row_f16c, LINEAR_ROWS, 0)

/* The same with AVX-512's 32 registers: 16 floats a widening and LINEAR_ROWS_WIDE rows a
 * tile, so a verify step's rows share one pass over (and one widening of) the weights: a
 * 7-token verify of the bundled target 3.3-3.8 ms against 4.5-5.9 in 4-row tiles. Up to 4
 * rows the AVX2 tile is as fast (measured), and its sums are the same. */
#define F16C_512 __attribute__((target("avx512f,avx512vl,fma,f16c")))
static inline __attribute__((always_inline)) F16C_512 void widen_row_f16c_512(
    const uint16_t *restrict in, float *restrict out) {
    for (int n = 0; n < LINEAR_COLS; n += 16)
        _mm512_storeu_ps(out + n, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(in + n))));
}
LINEAR_NARROW(f16c_512, static, F16C_512, uint16_t, widen_row_f16c_512, LINEAR_ROWS_WIDE, 0)

static int has_f16c(void) {
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
}

static specdec_task linear_blocks_f16(int64_t M) {
    if (M > LINEAR_ROWS && tile_rows() == LINEAR_ROWS_WIDE && has_f16c())
        return linear_blocks_f16c_512;
    return has_f16c() ? linear_blocks_f16c : linear_blocks_f16_generic;
}
#else
static specdec_task linear_blocks_f16(int64_t M) {
    (void)M;
    return linear_blocks_f16_generic;
}
#endif

void specdec_linear_bf16(const float *x, int64_t ldx, const void *packed, const float *bias,
                         const float *residual, int64_t ldr, float *y, int64_t M, int K, int N) {
    struct linear_args a = {x, bias, residual, packed, y, ldx, ldr, M, K, N};
    specdec_parallel_for(N / LINEAR_COLS, linear_blocks_bf16, &a);
}

void specdec_linear_f16(const float *x, int64_t ldx, const void *packed, const float *bias,
                        const float *residual, int64_t ldr, float *y, int64_t M, int K, int N) {
    struct linear_args a = {x, bias, residual, packed, y, ldx, ldr, M, K, N};
    specdec_parallel_for(N / LINEAR_COLS, linear_blocks_f16(M), &a);
}

/* ---- int8 weights (weight-only, W8A16) ----------------------------------------------------
 * The same linear over int8 weights with one float32 scale per output column: a column
 * block is K x 32 int8 values followed by its 32 scales (128 bytes), a quarter of
 * float32's bytes. Each row's products with the widened integers are summed exactly as
 * above, and each LINEAR_DEPTH partial sum is scaled before it joins the total, so the
 * result is batch invariant too (LINEAR_NARROW with SCALED; never widened once for a whole
 * block, which would have to fold the scales in). Up to rounding it is x @ (q * scale):
 * what PyTorch computes with the dequantized weight. */
static inline __attribute__((always_inline)) void widen_row_i8(const int8_t *restrict in,
                                                               float *restrict out) {
    for (int n = 0; n < LINEAR_COLS; ++n) out[n] = (float)in[n];
}
LINEAR_NARROW(i8_generic, static SPECDEC_CLONES, , int8_t, widen_row_i8, LINEAR_ROWS, 1)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* With AVX-512: 16 values widened by two instructions, one full-width store and load
 * (compiled from the loop above, the widening went through halves that the tile's
 * full-width loads then waited on: 1.6x bfloat16's time at one row), and
 * LINEAR_ROWS_WIDE rows a tile. */
#define AVX512_I8 __attribute__((target("avx512f,avx512vl,fma")))
static inline __attribute__((always_inline)) AVX512_I8 void widen_row_i8_512(
    const int8_t *restrict in, float *restrict out) {
    for (int n = 0; n < LINEAR_COLS; n += 16)
        _mm512_storeu_ps(out + n, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                      _mm_loadu_si128((const __m128i *)(in + n)))));
}
LINEAR_NARROW(i8_avx512, static, AVX512_I8, int8_t, widen_row_i8_512, LINEAR_ROWS_WIDE, 1)

static specdec_task linear_blocks_i8(void) {
    return tile_rows() == LINEAR_ROWS_WIDE ? linear_blocks_i8_avx512 : linear_blocks_i8_generic;
}
#else
static specdec_task linear_blocks_i8(void) { return linear_blocks_i8_generic; }
#endif

void specdec_linear_i8(const float *x, int64_t ldx, const void *packed, const float *bias,
                       const float *residual, int64_t ldr, float *y, int64_t M, int K, int N) {
    struct linear_args a = {x, bias, residual, packed, y, ldx, ldr, M, K, N};
    specdec_parallel_for(N / LINEAR_COLS, linear_blocks_i8(), &a);
}
