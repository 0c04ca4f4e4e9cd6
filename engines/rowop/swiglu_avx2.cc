// RowSwiGLU's avx2 variant: swiglu_impl.h over 8 lanes with FMA (V8): the avx2 and avxvnni paths'.
#include "swiglu_impl.h"
#include "vec_x86.h"

namespace rowop {

void swiglu_avx2(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y) { swiglu<V8>(x, inter, r0, r1, y); }

}  // namespace rowop
