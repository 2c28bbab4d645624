/* The GGUF linears for AVX2 with FMA and F16C: gguf_isa.h, four input rows a pass. */
#include "gguf_common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx2,fma,f16c")
#define ISA(name) name##_avx2
#define TILE 4
#define QUAD_OUTS 0
#include "gguf_isa.h"
#endif
