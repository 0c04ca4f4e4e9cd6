// RowSwiGLU's portable variant: swiglu_impl.h over scalars (V1), any CPU.
#include "swiglu_impl.h"

namespace rowop {

void swiglu_portable(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y) { swiglu<V1>(x, inter, r0, r1, y); }

}  // namespace rowop
