/* The GGUF linears in portable C (GCC vector types, no target ISA): gguf_isa.h, two input
 * rows a pass. */
#include "gguf_common.h"

#define ISA(name) name##_portable
#define TILE 2
#define QUAD_OUTS 0
#include "gguf_isa.h"
