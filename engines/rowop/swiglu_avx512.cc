// RowSwiGLU's avx512 variant: swiglu_impl.h over 16 lanes (V16).
#include "swiglu_impl.h"
#include "vec_x86.h"

namespace rowop {

void swiglu_avx512(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y) { swiglu<V16>(x, inter, r0, r1, y); }

}  // namespace rowop
