// The gated MLP's activation (the op RowSwiGLU, domain edgespec.rowop): y[r, i] = (g / (1 + exp(-g))) * u
// for g = x[r, i], u = x[r, inter + i], rows [r0, r1) of x [rows, 2 inter], in float32 with edgespec's
// exp (vec.h: vexp over [-87, 88], the attention's): one node for a layer's Split, QuickGelu and Mul,
// every path the same bits.
#pragma once

#include <cstdint>

namespace rowop {

using SwiGluFn = void (*)(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y);

// The variants, each in its own translation unit compiled for its instruction set (swiglu_<isa>.cc).
void swiglu_portable(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y);
void swiglu_avx2(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y);  // avx2 and avxvnni paths
void swiglu_avx512(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y);

}  // namespace rowop
