// RowSwiGLU (swiglu.h) written once over a vector policy V (vec.h), included by each variant's
// translation unit (swiglu_<isa>.cc) with its own flags: vectors of W, the tail one by one.
#pragma once

#include <cstdint>

#include "swiglu.h"
#include "vec.h"

namespace rowop {
namespace {

template <class V>
void swiglu(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y) {
  using T = typename V::T;
  const T one = V::set1(1.0f), zero = V::zero();
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = x + r * 2 * inter;
    const float* u = g + inter;
    float* o = y + r * inter;
    int64_t i = 0;
    for (; i + V::W <= inter; i += V::W) {
      const T gv = V::load(g + i);
      const T s = V::div(gv, V::add(one, vexp<V>(V::sub(zero, gv), 88.0f)));
      V::store(o + i, V::mul(s, V::load(u + i)));
    }
    for (; i < inter; ++i) {
      const float s = g[i] / (1.0f + vexp<V1>(0.0f - g[i], 88.0f));
      o[i] = s * u[i];
    }
  }
}

}  // namespace
}  // namespace rowop
