/* The exported kernels one C file calls from another (decoder_layers.c strings them
 * together); signatures as in dense_ops.c and paged_attention.c. */
#ifndef SPECDEC_OPS_H
#define SPECDEC_OPS_H

#include <stddef.h>
#include <stdint.h>

/* threads.c: run task(ctx, begin, end) over shares of [0, n) on the pool's threads. */
typedef void (*specdec_task)(void *ctx, int64_t begin, int64_t end);
void specdec_parallel_for(int64_t n, specdec_task task, void *ctx);
int specdec_set_num_threads(int n);
int specdec_num_threads(void);
float *specdec_scratch(size_t floats);

void specdec_rms_norm(const float *x, int64_t x_stride, const float *weight, float eps,
                      float *out, int64_t out_stride, int64_t rows, int dim);
void specdec_qk_norm_rope(float *qkv, int64_t tokens, int64_t token_stride, int heads,
                          int head_dim, const float *norm_weight, float eps,
                          const float *cos_table, const float *sin_signed_table,
                          const int64_t *positions);
void specdec_silu_and_mul(const float *gate_up, int64_t tokens, int inter, float *out);
void specdec_write_kv(float *layer, const int64_t *rows, const float *k, int64_t k_stride,
                      const float *v, int64_t v_stride, int64_t tokens, int row_size);
void specdec_linear(const float *x, int64_t ldx, const float *packed, const float *bias,
                    const float *residual, int64_t ldr, float *y, int64_t M, int K, int N);
void specdec_linear_bf16(const float *x, int64_t ldx, const void *packed, const float *bias,
                         const float *residual, int64_t ldr, float *y, int64_t M, int K, int N);
void specdec_linear_f16(const float *x, int64_t ldx, const void *packed, const float *bias,
                        const float *residual, int64_t ldr, float *y, int64_t M, int K, int N);
void specdec_linear_i8(const float *x, int64_t ldx, const void *packed, const float *bias,
                       const float *residual, int64_t ldr, float *y, int64_t M, int K, int N);
/* gguf_ops.c: a matrix in GGUF block formats, as up to four parts stacked along the
 * output rows (q, k and v may each have their own type). */
struct specdec_gguf_part {
    int32_t type; /* GGML type id */
    int32_t rows;
    const uint8_t *data;
};
struct specdec_gguf_weight {
    int32_t num_parts;
    struct specdec_gguf_part parts[4];
};
void specdec_linear_gguf(const float *x, int64_t ldx, const void *weight, const float *bias,
                         const float *residual, int64_t ldr, float *y, int64_t M, int K, int N);
void specdec_gguf_rows(const struct specdec_gguf_weight *w, const int64_t *ids, int64_t count,
                       int K, float *out);
int specdec_gguf_set_isa(int requested);
int specdec_paged_attention(const float *q, int64_t q_stride, const void *kv, int kind,
                            const float *table, const int64_t *qo_indptr,
                            const int64_t *kv_lens, const int64_t *page_indptr,
                            const int64_t *page_indices, int batch, int num_qo_heads,
                            int num_kv_heads, int head_dim, int page_size, float scale,
                            float v_scale, float *out);

#endif
