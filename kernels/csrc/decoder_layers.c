/* Every decoder layer of one step in one call: the kernels of dense_ops.c and
 * paged_attention.c in the order runtime/model.py's modules run them, over caller-owned
 * buffers.
 *
 * At decode and verify sizes a layer's arithmetic takes tens of microseconds and its ten
 * ops cost as much again in Python dispatch; here the layer loop is C. Same kernels (the
 * linear for the weights' storage dtype), same order, same rounding: the hidden states equal the per-op path's bit for bit. Float32
 * KV caches only (the cache write is a row copy); runtime/model.py keeps the per-op path
 * for the rest. The caller (kernels/decoder_layers.py) checks every shape; this file
 * trusts them. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ops.h"

/* One layer's weights: linears packed as dense_ops.c's specdec_linear reads them, NULL
 * bias or q/k norm where the model has none. */
struct specdec_layer {
    const float *input_norm, *qkv, *qkv_bias, *qk_norm, *o_proj, *o_bias;
    const float *post_norm, *gate_up, *gate_up_bias, *down, *down_bias;
};

/* The model's shape and the step's batch: positions, the KV cache's layers and write
 * rows, the ragged page tables. */
struct specdec_step {
    int64_t tokens;
    int hidden, num_heads, num_kv_heads, head_dim, intermediate;
    float eps, qk_eps, sm_scale;
    const float *cos, *sin_signed;
    const int64_t *positions;
    float *const *kv_layers;
    const int64_t *kv_rows;
    const int64_t *qo_indptr, *kv_lens, *page_indptr, *page_indices;
    int batch, page_size;
    /* the linears: packed 0 float32, 1 bfloat16, 2 float16, 3 int8; or 4 GGUF blocks (each
     * weight a struct specdec_gguf_weight, the greedy loop's embedding too) */
    int weight_kind;
};

typedef void (*linear_fn)(const float *, int64_t, const void *, const float *, const float *,
                          int64_t, float *, int64_t, int, int);

static void linear_f32(const float *x, int64_t ldx, const void *packed, const float *bias,
                       const float *residual, int64_t ldr, float *y, int64_t M, int K, int N) {
    specdec_linear(x, ldx, packed, bias, residual, ldr, y, M, K, N);
}

static linear_fn linear_for(int weight_kind) {
    return weight_kind == 1   ? specdec_linear_bf16
           : weight_kind == 2 ? specdec_linear_f16
           : weight_kind == 3 ? specdec_linear_i8
           : weight_kind == 4 ? specdec_linear_gguf
                              : linear_f32;
}

/* hidden [tokens][hidden] in, the last layer's output in `hidden` again; `scratch` holds
 * tokens x (2 hidden + qkv + q + 3 intermediate) floats. Returns 0, or -1 when the
 * attention kernel cannot allocate its scratch. */
int specdec_decoder_layers(const struct specdec_layer *layers, int num_layers,
                           const struct specdec_step *s, float *hidden, float *scratch) {
    const int64_t T = s->tokens;
    const int H = s->hidden, D = s->head_dim, I = s->intermediate;
    const int q_width = s->num_heads * D, kv_width = s->num_kv_heads * D;
    const int qkv_width = q_width + 2 * kv_width;
    float *normed = scratch;
    float *mid = normed + T * H; /* the residual stream between attention and MLP */
    float *qkv = mid + T * H;
    float *attn = qkv + T * qkv_width;
    float *gate_up = attn + T * q_width;
    float *act = gate_up + T * 2 * I;
    const linear_fn linear = linear_for(s->weight_kind);
    for (int l = 0; l < num_layers; ++l) {
        const struct specdec_layer *w = &layers[l];
        specdec_rms_norm(hidden, H, w->input_norm, s->eps, normed, H, T, H);
        linear(normed, H, w->qkv, w->qkv_bias, NULL, 0, qkv, T, H, qkv_width);
        specdec_qk_norm_rope(qkv, T, qkv_width, s->num_heads + s->num_kv_heads, D, w->qk_norm,
                             s->qk_eps, s->cos, s->sin_signed, s->positions);
        float *kv = s->kv_layers[l];
        specdec_write_kv(kv, s->kv_rows, qkv + q_width, qkv_width, qkv + q_width + kv_width,
                         qkv_width, T, kv_width);
        if (specdec_paged_attention(qkv, qkv_width, kv, 0, NULL, s->qo_indptr, s->kv_lens,
                                    s->page_indptr, s->page_indices, s->batch, s->num_heads,
                                    s->num_kv_heads, D, s->page_size, s->sm_scale, 1.0f,
                                    attn) != 0)
            return -1;
        linear(attn, q_width, w->o_proj, w->o_bias, hidden, H, mid, T, q_width, H);
        specdec_rms_norm(mid, H, w->post_norm, s->eps, normed, H, T, H);
        linear(normed, H, w->gate_up, w->gate_up_bias, NULL, 0, gate_up, T, H, 2 * I);
        specdec_silu_and_mul(gate_up, T, I, act);
        linear(act, I, w->down, w->down_bias, mid, H, hidden, T, I, H);
    }
    return 0;
}

/* Greedy decoding, `steps` tokens per sequence of the step's batch (one token each per
 * forward): the embedding row of each sequence's token, every layer, the final RMSNorm,
 * the head and its argmax, whose token the next forward feeds. Per forward t the step
 * takes positions[t], kv_rows[t] (K rows then V rows) and kv_lens[t]; the page tables
 * already hold every token's page. Same kernels as the per-op path, so each forward's
 * logits equal extend's; ties go to the smaller token id, as torch.argmax over the full
 * vocabulary. */
struct specdec_greedy {
    int steps;
    const void *embed; /* float32 [vocab][hidden], or GGUF blocks (weight_kind 4) */
    const float *final_norm;
    float final_eps;
    const void *head; /* packed as the layers' linears: [rows / 32][hidden][32] */
    int head_rows;
    const int64_t *head_ids; /* row -> token id, NULL when the head covers the vocabulary */
    /* [steps][batch], [steps][2 batch], [steps][batch] */
    const int64_t *positions, *kv_rows, *kv_lens;
    /* A sequence stops picking at the first pick whose probability (softmax over the
     * head's logits) is below min_prob (0: never), picks before min_prob_from excepted;
     * num_picks [batch] gets how many picks each kept. The loop ends once every sequence
     * has stopped. */
    float min_prob;
    int min_prob_from;
    int64_t *num_picks;
    /* NULL, or a flag another thread may set: once it is non-zero, no further forward
     * starts, and each sequence still picking keeps the picks made so far. */
    const volatile int32_t *stop;
};

/* tokens [batch] in: the first token each sequence feeds; out [steps][batch] the picks.
 * hidden holds batch x hidden floats, scratch the layers' scratch, logits batch x
 * head_rows. Returns 0, or the layers' error. */
int specdec_greedy_decode(const struct specdec_layer *layers, int num_layers,
                          const struct specdec_step *step, const struct specdec_greedy *g,
                          const int64_t *tokens, int64_t *out, float *hidden, float *scratch,
                          float *logits) {
    struct specdec_step s = *step;
    const int64_t B = s.tokens;
    const int H = s.hidden;
    const linear_fn linear = linear_for(s.weight_kind);
    int64_t num_active = B;
    for (int64_t b = 0; b < B; ++b) g->num_picks[b] = g->steps;
    for (int t = 0; t < g->steps && num_active > 0; ++t) {
        if (t > 0 && g->stop != NULL && *g->stop != 0) {
            for (int64_t b = 0; b < B; ++b)
                if (g->num_picks[b] > t) g->num_picks[b] = t;
            break;
        }
        const int64_t *feed = t == 0 ? tokens : out + (int64_t)(t - 1) * B;
        if (s.weight_kind == 4)
            specdec_gguf_rows(g->embed, feed, B, H, hidden);
        else
            for (int64_t b = 0; b < B; ++b)
                memcpy(hidden + b * H, (const float *)g->embed + feed[b] * H,
                       sizeof(float) * (size_t)H);
        s.positions = g->positions + (int64_t)t * B;
        s.kv_rows = g->kv_rows + (int64_t)t * 2 * B;
        s.kv_lens = g->kv_lens + (int64_t)t * B;
        const int status = specdec_decoder_layers(layers, num_layers, &s, hidden, scratch);
        if (status != 0) return status;
        specdec_rms_norm(hidden, H, g->final_norm, g->final_eps, scratch, H, B, H);
        linear(scratch, H, g->head, NULL, NULL, 0, logits, B, H, g->head_rows);
        for (int64_t b = 0; b < B; ++b) {
            if (g->num_picks[b] < g->steps) { /* stopped: feeds its last token again */
                out[(int64_t)t * B + b] = feed[b];
                continue;
            }
            const float *row = logits + b * g->head_rows;
            int best = 0;
            for (int r = 1; r < g->head_rows; ++r) {
                const int64_t id = g->head_ids ? g->head_ids[r] : r;
                const int64_t best_id = g->head_ids ? g->head_ids[best] : best;
                if (row[r] > row[best] || (row[r] == row[best] && id < best_id)) best = r;
            }
            if (g->min_prob > 0.0f && t >= g->min_prob_from) {
                double sum = 0.0;
                for (int r = 0; r < g->head_rows; ++r) sum += exp((double)(row[r] - row[best]));
                if (1.0 / sum < (double)g->min_prob) {
                    g->num_picks[b] = t;
                    --num_active;
                    out[(int64_t)t * B + b] = feed[b];
                    continue;
                }
            }
            out[(int64_t)t * B + b] = g->head_ids ? g->head_ids[best] : best;
        }
    }
    return 0;
}
