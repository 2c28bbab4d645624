/* The GGUF kernels for one instruction set: gguf_portable.c, gguf_avx2.c and gguf_avx512.c
 * each include this file once, under its `#pragma GCC target`, with ISA(name) naming that
 * copy's functions and TILE the input rows a pass over a dequantised output row (as many as
 * the ISA's registers hold the sums of), QUAD_OUTS whether they hold four output rows' sums
 * at QUAD_ROWS input rows.
 * Lane for lane the copies compute the same values (see gguf_ops.c). */

static inline __attribute__((always_inline)) vf ISA(load_vf)(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A block's float16 scale: one vcvtph2ps where the ISA has F16C. */
static inline __attribute__((always_inline)) float ISA(scale)(const uint8_t *p) {
#if defined(__F16C__)
    uint16_t bits;
    memcpy(&bits, p, 2);
    return _cvtsh_ss(bits);
#else
    return f16_to_f32(p);
#endif
}

/* A float in every lane: a broadcast load, which takes no vector port. */
static inline __attribute__((always_inline)) vf ISA(splat)(float v) {
    return (vf){0} + v;
}

/* The float16 scales of blocks [first, end) of a Q8_0, Q4_0 or Q4_1 row widened into
 * out[scales_per_block(type) * (i - first) + j], before the pass over those blocks, where
 * converting each in the pass took a broadcast and a conversion on the vector ports the
 * dequantisation needs. On AVX-512 one gather reads 16 blocks' scales and vcvtph2ps widens
 * them (copying them out first stalled the wide load on the narrow stores); elsewhere one
 * at a time. The same float16 -> float32 values either way. */
static inline __attribute__((always_inline)) void ISA(block_scales)(int type, const uint8_t *restrict row,
                                                                int64_t first, int64_t end,
                                                                float *restrict out) {
    const int64_t bytes = type == GGML_Q8_0 ? 34 : type == GGML_Q4_0 ? 18 : 20;
    const int per_block = scales_per_block(type);
#if defined(__AVX512F__)
    const __m512i offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)bytes));
    for (int64_t i = first; i < end; i += 16) {
        const __mmask16 live = end - i >= 16 ? 0xffff : (__mmask16)((1u << (end - i)) - 1);
        /* Each lane: the block's first four bytes, d (and m for Q4_1) as float16. */
        const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets,
                                                          row + i * bytes, 1);
        float *o = out + per_block * (i - first);
        if (per_block == 2) {
            const __m512 low = _mm512_cvtph_ps(_mm512_castsi512_si256(words));
            const __m512 high = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(words, 1));
            memcpy(o, &low, sizeof low);
            memcpy(o + 16, &high, sizeof high);
        } else {
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
            memcpy(o, &d, sizeof d);
        }
    }
#else
    for (int64_t i = first; i < end; ++i)
        for (int j = 0; j < per_block; ++j)
            out[per_block * (i - first) + j] = ISA(scale)(row + i * bytes + 2 * j);
#endif
}

/* 16 bytes widened to int32 lanes, as unsigned or (`is_signed`, a constant) signed
 * values: vpmovzxbd / vpmovsxbd where the ISA has them (GCC's own conversions of byte
 * vectors went element by element). */
static inline __attribute__((always_inline)) vi ISA(widen_bytes)(const uint8_t *restrict p,
                                                                 const int is_signed) {
    vi v;
#if defined(__AVX512F__)
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    v = (vi)(is_signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
#elif defined(__AVX2__)
    __m256i halves[2];
    for (int h = 0; h < 2; ++h) {
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)(p + 8 * h));
        halves[h] = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    }
    memcpy(&v, halves, sizeof v);
#else
    for (int j = 0; j < 16; ++j) v[j] = is_signed ? (int8_t)p[j] : p[j];
#endif
    return v;
}

static inline __attribute__((always_inline)) vf ISA(to_vf)(vi q) {
    return __builtin_convertvector(q, vf);
}

/* Values [32 i, 32 i + 32) of an output row of `type` in two halves w[0], w[1]; a Q8_0,
 * Q4_0 or Q4_1 block's scales (d, and m for Q4_1) come widened in `scales` (block_scales). */
static inline __attribute__((always_inline)) void ISA(dequant32)(int type, const uint8_t *restrict row,
                                                             int64_t i, const float *scales,
                                                             vf w[2]) {
    w[0] = w[1] = (vf){0};
    switch (type) {
    case GGML_Q8_0: {
        const uint8_t *b = row + i * 34;
        const vf d = ISA(splat)(scales[0]);
        for (int h = 0; h < 2; ++h) w[h] = d * ISA(to_vf)(ISA(widen_bytes)(b + 2 + 16 * h, 1));
        break;
    }
    case GGML_Q4_0: {
        const uint8_t *b = row + i * 18;
        const vf d = ISA(splat)(scales[0]);
        const vi q = ISA(widen_bytes)(b + 2, 0);
        w[0] = d * ISA(to_vf)((q & 15) - 8);
        w[1] = d * ISA(to_vf)((q >> 4) - 8);
        break;
    }
    case GGML_Q4_1: {
        const uint8_t *b = row + i * 20;
        const vf d = ISA(splat)(scales[0]), m = ISA(splat)(scales[1]);
        const vi q = ISA(widen_bytes)(b + 4, 0);
#if defined(__AVX512F__)
        /* The block's 16 possible values d q + m, then each nibble picks its own (vpermps):
         * the same values as converting every nibble, in fewer instructions. */
        const vf values = d * (vf){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} + m;
        w[0] = (vf)_mm512_permutexvar_ps((__m512i)q, (__m512)values); /* vpermps reads the low 4 bits */
        w[1] = (vf)_mm512_permutexvar_ps((__m512i)(q >> 4), (__m512)values);
#else
        w[0] = d * ISA(to_vf)(q & 15) + m;
        w[1] = d * ISA(to_vf)(q >> 4) + m;
#endif
        break;
    }
    case GGML_Q4_K:
    case GGML_Q5_K: {
        const int five = type == GGML_Q5_K;
        const uint8_t *b = row + i / 8 * (five ? 176 : 144);
        const int g = (int)(i % 8), shift = 4 * (g % 2);
        int sc, mn;
        k_scale_min(b + 4, g, &sc, &mn);
        const float ds = ISA(scale)(b) * (float)sc, dm = ISA(scale)(b + 2) * (float)mn;
        const uint8_t *q = b + (five ? 48 : 16) + (g / 2) * 32;
        for (int h = 0; h < 2; ++h) {
            vi v = (ISA(widen_bytes)(q + 16 * h, 0) >> shift) & 15;
            if (five) v |= ((ISA(widen_bytes)(b + 16 + 16 * h, 0) >> g) & 1) << 4;
            w[h] = ds * ISA(to_vf)(v) - dm;
        }
        break;
    }
    case GGML_Q6_K: {
        const uint8_t *b = row + i / 8 * 210;
        const int s = (int)(i % 8), h = s / 4, g = s % 4;
        const uint8_t *lo = b + h * 64 + (g % 2) * 32, *hi = b + 128 + h * 32;
        const int8_t *scales = (const int8_t *)(b + 192);
        const float d = ISA(scale)(b + 208);
        const int e = s * 32 / 16;
        for (int half = 0; half < 2; ++half) {
            const vi q = (((ISA(widen_bytes)(lo + 16 * half, 0) >> (4 * (g / 2))) & 15) |
                          (((ISA(widen_bytes)(hi + 16 * half, 0) >> (2 * g)) & 3) << 4)) - 32;
            w[half] = (d * (float)scales[e + half]) * ISA(to_vf)(q);
        }
        break;
    }
    }
}

/* Rows of float types, any width, into out[K]. */
static inline __attribute__((always_inline)) void ISA(widen_row)(int type, const uint8_t *restrict row,
                                                             int K, float *restrict out) {
    const uint16_t *restrict h = (const uint16_t *)row;
    if (type == GGML_F32)
        memcpy(out, row, sizeof(float) * (size_t)K);
    else if (type == GGML_F16)
        for (int k = 0; k < K; ++k) out[k] = widen_f16(h[k]);
    else
        for (int k = 0; k < K; ++k) out[k] = widen_bf16(h[k]);
}

/* One output row of K values, dequantised into out. */
static inline __attribute__((always_inline)) void ISA(dequant_row)(int type, const uint8_t *restrict row,
                                                               int K, float *restrict out) {
    if (is_float_type(type)) {
        ISA(widen_row)(type, row, K, out);
        return;
    }
    const int64_t blocks = K / 32;
    float scales[SCALES_PER_BLOCK * SCALE_BLOCKS];
    for (int64_t i = 0; i < blocks; ++i) {
        if (i % SCALE_BLOCKS == 0 && has_block_scales(type))
            ISA(block_scales)(type, row, i, i + SCALE_BLOCKS < blocks ? i + SCALE_BLOCKS : blocks, scales);
        vf w[2];
        ISA(dequant32)(type, row, i, scales + scales_per_block(type) * (i % SCALE_BLOCKS), w);
        memcpy(out + 32 * i, w, sizeof w);
    }
}

/* The 32 lanes of a dot product (two halves) added in one fixed tree: lane l with l + 16,
 * then l with l + 8, l + 4, l + 2, l + 1. Every step adds lane to lane, so each ISA's copy
 * gives the same bits. */
static inline __attribute__((always_inline)) float ISA(lanes_sum)(vf low, vf high) {
    const vf s16 = low + high;
    v8 s8[2];
    memcpy(s8, &s16, sizeof s8);
    const v8 t8 = s8[0] + s8[1];
    v4 s4[2];
    memcpy(s4, &t8, sizeof s4);
    const v4 t4 = s4[0] + s4[1];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* sums[o][m] = x[m] . w_o for the `outs` output rows (1, or 2 or 4 of a quantized type,
 * each `stride` bytes after the one before: independent sets of sums keep the FMA units
 * busy at a few input rows), over the row 32 values at a time. Lane l sums the
 * products at k = l (mod 32) in increasing k, whatever `rows` and `outs` are; they are
 * constants where this is inlined, so the lanes stay in registers. Float rows are widened
 * into `wide` first (their width need not be a multiple of 32: the tail joins the lanes
 * it falls in). */
static inline __attribute__((always_inline)) void ISA(dot_rows)(
    int rows, int outs, int type, const uint8_t *restrict row, int64_t stride,
    const float *restrict x, int64_t ldx, int K, float *restrict wide,
    float sums[MAX_OUTS][TILE_ROWS]) {
    vf acc[MAX_OUTS][TILE_ROWS][2];
    for (int o = 0; o < outs; ++o)
        for (int m = 0; m < rows; ++m) acc[o][m][0] = acc[o][m][1] = (vf){0};
    const int64_t blocks = K / 32;
    const int64_t block_bytes = blocks ? stride / blocks : 0; /* bytes of 32 values */
    const int floats = is_float_type(type);
    if (floats) ISA(widen_row)(type, row, K, wide);
    const int scaled = has_block_scales(type);
    float scales[MAX_OUTS][SCALES_PER_BLOCK * SCALE_BLOCKS];
    for (int64_t first = 0; first < blocks; first += SCALE_BLOCKS) {
        const int64_t end = first + SCALE_BLOCKS < blocks ? first + SCALE_BLOCKS : blocks;
        if (scaled)
            for (int o = 0; o < outs; ++o) ISA(block_scales)(type, row + o * stride, first, end, scales[o]);
        for (int64_t i = first; i < end; ++i) {
            /* The rows PREFETCH_PASSES passes ahead, as far along as this one is in its own:
             * the hardware prefetcher alone left the rows' first lines to miss. */
            for (int ahead = PREFETCH_PASSES * outs; ahead < (PREFETCH_PASSES + 1) * outs; ++ahead)
                __builtin_prefetch(row + ahead * stride + i * block_bytes);
            for (int o = 0; o < outs; ++o) {
                vf w[2];
                if (floats) {
                    w[0] = ISA(load_vf)(wide + 32 * i);
                    w[1] = ISA(load_vf)(wide + 32 * i + 16);
                } else {
                    ISA(dequant32)(type, row + o * stride, i,
                                   scales[o] + scales_per_block(type) * (i - first), w);
                }
                for (int m = 0; m < rows; ++m) {
                    acc[o][m][0] += ISA(load_vf)(x + m * ldx + 32 * i) * w[0];
                    acc[o][m][1] += ISA(load_vf)(x + m * ldx + 32 * i + 16) * w[1];
                }
            }
        }
    }
    for (int o = 0; o < outs; ++o)
        for (int m = 0; m < rows; ++m) {
            if (floats && K % 32) {
                float lanes[32];
                memcpy(lanes, acc[o][m], sizeof lanes);
                for (int k = (int)blocks * 32; k < K; ++k)
                    lanes[k % 32] += x[m * ldx + k] * wide[k];
                memcpy(acc[o][m], lanes, sizeof lanes);
            }
            sums[o][m] = ISA(lanes_sum)(acc[o][m][0], acc[o][m][1]);
        }
}

#define DOT(R, O, TYPE) ISA(dot_rows)(R, O, TYPE, row, stride, x, ldx, K, wide, sums)
#define DOT_ROWS(TYPE)                                                                           \
    if (QUAD_OUTS && outs == 4) { /* compiled only where the ISA takes four */                   \
        if (rows == 2)                                                                           \
            DOT(2, 4, TYPE);                                                                     \
        else                                                                                     \
            DOT(1, 4, TYPE);                                                                     \
    } else if (outs == 2) {                                                                      \
        switch (rows) {                                                                          \
        case 4: DOT(4, 2, TYPE); break;                                                          \
        case 3: DOT(3, 2, TYPE); break;                                                          \
        case 2: DOT(2, 2, TYPE); break;                                                          \
        default: DOT(1, 2, TYPE); break;                                                         \
        }                                                                                        \
    } else {                                                                                     \
        switch (rows) {                                                                          \
        case 8: DOT(8, 1, TYPE); break;                                                          \
        case 7: DOT(7, 1, TYPE); break;                                                          \
        case 6: DOT(6, 1, TYPE); break;                                                          \
        case 5: DOT(5, 1, TYPE); break;                                                          \
        case 4: DOT(4, 1, TYPE); break;                                                          \
        case 3: DOT(3, 1, TYPE); break;                                                          \
        case 2: DOT(2, 1, TYPE); break;                                                          \
        default: DOT(1, 1, TYPE); break;                                                         \
        }                                                                                        \
    }

/* Output rows [first, end), each dotted with every input row, `tile` input rows a pass
 * (four output rows a pass where at most QUAD_ROWS input rows come and the ISA holds
 * their sums, QUAD_OUTS; two where at most PAIR_ROWS come). */
static inline __attribute__((always_inline)) void ISA(gguf_rows)(const struct gguf_linear_args *a,
                                                                 int64_t first, int64_t end,
                                                                 float *restrict wide,
                                                                 const int tile) {
    const int K = a->K;
    float sums[MAX_OUTS][TILE_ROWS];
    int part = 0;
    int64_t part_start = 0;
    for (int64_t n = first; n < end;) {
        while (n >= part_start + a->w->parts[part].rows) part_start += a->w->parts[part++].rows;
        const struct specdec_gguf_part *p = &a->w->parts[part];
        const int type = p->type;
        const int64_t stride = row_bytes(type, K);
        const uint8_t *row = p->data + (n - part_start) * stride;
        const int64_t left = (end < part_start + p->rows ? end : part_start + p->rows) - n;
        const int outs = is_float_type(type) || a->M > PAIR_ROWS       ? 1
                         : QUAD_OUTS && a->M <= QUAD_ROWS && left >= 4 ? 4
                         : left >= 2                                   ? 2
                                                                       : 1;
        const int row_tile = outs == 4 ? QUAD_ROWS : outs == 2 ? PAIR_ROWS : tile;
        for (int64_t m0 = 0; m0 < a->M; m0 += row_tile) {
            const int rows = a->M - m0 < row_tile ? (int)(a->M - m0) : row_tile;
            const float *x = a->x + m0 * a->ldx;
            const int64_t ldx = a->ldx;
            /* Constant types and row counts: each pairing compiles to its own loop. */
            switch (type) {
            case GGML_Q8_0: DOT_ROWS(GGML_Q8_0); break;
            case GGML_Q4_0: DOT_ROWS(GGML_Q4_0); break;
            case GGML_Q4_1: DOT_ROWS(GGML_Q4_1); break;
            case GGML_Q4_K: DOT_ROWS(GGML_Q4_K); break;
            case GGML_Q5_K: DOT_ROWS(GGML_Q5_K); break;
            case GGML_Q6_K: DOT_ROWS(GGML_Q6_K); break;
            default: DOT_ROWS(type); break; /* float rows */
            }
            for (int o = 0; o < outs; ++o)
                for (int m = 0; m < rows; ++m) {
                    const int64_t r = m0 + m;
                    float base = a->bias ? a->bias[n + o] : 0.0f;
                    if (a->residual) base = a->residual[r * a->ldr + n + o] + base;
                    a->y[r * a->N + n + o] = base + sums[o][m];
                }
        }
        n += outs;
    }
}

#undef DOT
#undef DOT_ROWS

void ISA(linear)(void *ctx, int64_t first, int64_t end) {
    const struct gguf_linear_args *a = ctx;
    float *wide = specdec_scratch((size_t)a->K);
    if (wide != NULL) ISA(gguf_rows)(a, first, end, wide, TILE);
}

void ISA(dequant)(int type, const uint8_t *row, int K, float *out) {
    ISA(dequant_row)(type, row, K, out);
}
