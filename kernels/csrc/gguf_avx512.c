/* The GGUF linears for AVX-512 (F, BW, VL) with FMA and F16C: gguf_isa.h, eight input rows
 * a pass, four output rows a pass at up to QUAD_ROWS input rows. */
#include "gguf_common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")
#define ISA(name) name##_avx512
#define TILE 8
#define QUAD_OUTS 1
#include "gguf_isa.h"
#endif
