/* Paged causal attention on the CPU, reading K/V pages where they lie.
 *
 * The same function as kernels/attention/reference.py (FlashInfer's FP8 math:
 * S = q.K8^T * sm_scale * k_scale, O = softmax(S).V8 * v_scale), computed one
 * (sequence, KV head) at a time with an online softmax over whole pages, so no K/V is
 * gathered or padded. Each page's K and V rows for the head are decoded to float32 once
 * and then serve every query row of the head's GQA group.
 *
 * Layout (FlashInfer NHD): a layer is [num_pages][2][page_size][num_kv_heads][head_dim],
 * K at index 0 of the second dimension, V at 1. Queries are float32 [num_tokens][num_qo_heads]
 * [head_dim] rows `q_stride` floats apart, the output the same shape, contiguous; both
 * are ragged by qo_indptr; sequence b's query t sits at
 * position kv_lens[b] - q_len + t and sees keys 0..that position. The caller (Python)
 * checks every shape and index; this file trusts them.
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum kv_kind { KV_FLOAT32 = 0, KV_BFLOAT16 = 1, KV_BYTE_TABLE = 2 };

#define KEYS 16 /* keys scored at once: one AVX-512 register of float32 */

/* Rows [count][head_dim] of one head of one page half as float32: a pointer into the
 * page itself for float32 storage, else decoded into `buffer`. */
static inline const float *page_rows(const void *kv, int kind, const float *table,
                                     int64_t offset, int count, int row_stride,
                                     int head_dim, float *buffer, int *stride) {
    if (kind == KV_FLOAT32) {
        *stride = row_stride;
        return (const float *)kv + offset;
    }
    *stride = head_dim;
    for (int j = 0; j < count; ++j) {
        const int64_t at = offset + (int64_t)j * row_stride;
        float *out = buffer + (int64_t)j * head_dim;
        if (kind == KV_BFLOAT16) {
            const uint16_t *src = (const uint16_t *)kv + at;
            for (int d = 0; d < head_dim; ++d) {
                union { uint32_t bits; float value; } v = {.bits = (uint32_t)src[d] << 16};
                out[d] = v.value;
            }
        } else {
            const uint8_t *src = (const uint8_t *)kv + at;
            for (int d = 0; d < head_dim; ++d) out[d] = table[src[d]];
        }
    }
    return buffer;
}

/* One sequence: every query row of every KV head's group, page by page (all heads of a
 * page while it is in cache), with an online softmax updated once per block of KEYS keys. */
static inline __attribute__((always_inline)) void attend_sequence(
    const float *q, int64_t q_stride, const void *kv, int kind, const float *table,
    const int64_t *pages, int64_t kv_len, int64_t q_len, int64_t first_token,
    int num_qo_heads, int num_kv_heads, const int head_dim, int page_size, float scale,
    float v_scale, float *out, float *scratch) {
    const int group = num_qo_heads / num_kv_heads;
    const int rows = (int)q_len * num_qo_heads; /* row r: token r / num_qo_heads, head r % */
    const int row_stride = num_kv_heads * head_dim; /* between tokens of a page half */
    const int64_t half = (int64_t)page_size * row_stride;
    float *k_buffer = scratch;                          /* [page_size][head_dim] */
    float *v_buffer = k_buffer + page_size * head_dim;  /* [page_size][head_dim] */
    float *row_max = v_buffer + page_size * head_dim;   /* [rows] */
    float *row_sum = row_max + rows;                    /* [rows] */
    float *acc = row_sum + rows;                        /* [rows][head_dim] */
    for (int r = 0; r < rows; ++r) {
        row_max[r] = -FLT_MAX;
        row_sum[r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)rows * head_dim);
    const int64_t start = kv_len - q_len;
    const int64_t num_pages = (kv_len + page_size - 1) / page_size;
    for (int64_t p = 0; p < num_pages; ++p) {
        const int64_t base = p * page_size;
        const int in_page = (int)(kv_len - base < page_size ? kv_len - base : page_size);
        for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
            const int64_t k_offset = pages[p] * 2 * half + (int64_t)kv_head * head_dim;
            int k_stride, v_stride;
            const float *k_rows = page_rows(kv, kind, table, k_offset, in_page, row_stride,
                                            head_dim, k_buffer, &k_stride);
            const float *v_rows = page_rows(kv, kind, table, k_offset + half, in_page,
                                            row_stride, head_dim, v_buffer, &v_stride);
            for (int j0 = 0; j0 < in_page; j0 += KEYS) {
                const int in_block = in_page - j0 < KEYS ? in_page - j0 : KEYS;
                for (int64_t t = 0; t < q_len; ++t) {
                    const int64_t visible = start + t - (base + j0) + 1; /* causal */
                    const int count = (int)(visible < in_block ? visible : in_block);
                    if (count <= 0) continue;
                    for (int g = 0; g < group; ++g) {
                        const int head = kv_head * group + g;
                        const int r = (int)t * num_qo_heads + head;
                        const float *restrict qr = q + (first_token + t) * q_stride +
                                                   (int64_t)head * head_dim;
                        float scores[KEYS];
                        float block_max = -FLT_MAX;
                        for (int j = 0; j < count; ++j) {
                            const float *restrict kr = k_rows + (int64_t)(j0 + j) * k_stride;
                            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                            for (int d = 0; d < head_dim; ++d) dot += qr[d] * kr[d];
                            scores[j] = dot * scale;
                            block_max = scores[j] > block_max ? scores[j] : block_max;
                        }
                        float *restrict ar = acc + (int64_t)r * head_dim;
                        const float new_max = block_max > row_max[r] ? block_max : row_max[r];
                        if (new_max > row_max[r] && row_sum[r] > 0.0f) {
                            const float shrink = exp_clamped(row_max[r] - new_max);
                            row_sum[r] *= shrink;
                            for (int d = 0; d < head_dim; ++d) ar[d] *= shrink;
                        }
                        row_max[r] = new_max;
                        float weights[KEYS];
                        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                        for (int j = 0; j < KEYS; ++j) {
                            weights[j] = j < count ? exp_clamped(scores[j] - new_max) : 0.0f;
                            sum += weights[j];
                        }
                        row_sum[r] += sum;
                        for (int j = 0; j < count; ++j) {
                            const float w = weights[j];
                            const float *restrict vr = v_rows + (int64_t)(j0 + j) * v_stride;
#pragma omp simd
                            for (int d = 0; d < head_dim; ++d) ar[d] += w * vr[d];
                        }
                    }
                }
            }
        }
    }
    /* Rows are laid out as the output's [q_len][num_qo_heads][head_dim]. */
    float *o = out + first_token * num_qo_heads * (int64_t)head_dim;
    for (int r = 0; r < rows; ++r) {
        const float norm = v_scale / row_sum[r]; /* every row sees at least its own key */
        for (int d = 0; d < head_dim; ++d) o[(int64_t)r * head_dim + d] = acc[(int64_t)r * head_dim + d] * norm;
    }
}

/* One function per common head size, so loops over head_dim have constant trip counts,
 * and one per instruction set (chosen when the library loads). */
#define ATTEND_VARIANT(name, HEAD_DIM)                                                        \
    SPECDEC_CLONES static void name(const float *q, int64_t q_stride, const void *kv,        \
                                    int kind, const float *table, const int64_t *pages,      \
                                    int64_t kv_len, int64_t q_len, int64_t first_token,      \
                                    int num_qo_heads, int num_kv_heads, int head_dim,        \
                                    int page_size, float scale, float v_scale, float *out,   \
                                    float *scratch) {                                         \
        (void)head_dim;                                                                       \
        attend_sequence(q, q_stride, kv, kind, table, pages, kv_len, q_len, first_token,     \
                        num_qo_heads, num_kv_heads, HEAD_DIM, page_size, scale, v_scale,     \
                        out, scratch);                                                        \
    }
ATTEND_VARIANT(attend_64, 64)
ATTEND_VARIANT(attend_128, 128)
ATTEND_VARIANT(attend_any, head_dim)

/* The whole ragged batch. Returns 0, or -1 when scratch memory cannot be allocated. */
int specdec_paged_attention(const float *q, int64_t q_stride, const void *kv, int kind,
                            const float *table,
                            const int64_t *qo_indptr, const int64_t *kv_lens,
                            const int64_t *page_indptr, const int64_t *page_indices,
                            int batch, int num_qo_heads, int num_kv_heads, int head_dim,
                            int page_size, float scale, float v_scale, float *out) {
    int64_t max_rows = 0;
    for (int b = 0; b < batch; ++b) {
        const int64_t rows = (qo_indptr[b + 1] - qo_indptr[b]) * num_qo_heads;
        if (rows > max_rows) max_rows = rows;
    }
    const size_t floats = (size_t)page_size * 2 * head_dim + (size_t)max_rows * (head_dim + 2);
    float *scratch = malloc(sizeof(float) * floats);
    if (scratch == NULL) return -1;
    void (*attend)(const float *, int64_t, const void *, int, const float *, const int64_t *,
                   int64_t, int64_t, int64_t, int, int, int, int, float, float, float *,
                   float *) = head_dim == 64 ? attend_64 : head_dim == 128 ? attend_128 : attend_any;
    for (int b = 0; b < batch; ++b) {
        attend(q, q_stride, kv, kind, table, page_indices + page_indptr[b], kv_lens[b],
               qo_indptr[b + 1] - qo_indptr[b], qo_indptr[b], num_qo_heads, num_kv_heads,
               head_dim, page_size, scale, v_scale, out, scratch);
    }
    free(scratch);
    return 0;
}
