// The vector policies the float ops (attention, SwiGLU) are written over once: V1 here (scalars with
// std::fma, the definition), V8 (vec_x86.h: AVX2 + FMA) and V16 (vec_x86.h: AVX-512), and edgespec's exp
// over them. Everything here has internal linkage: each path's translation unit keeps its own copy,
// compiled with its own -m flags.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "half.h"

namespace rowop {
namespace {

// Scalar policy: the definition (std::fma rounds once, as vfmadd does).
struct V1 {
  using T = float;
  static constexpr int W = 1;
  static T zero() { return 0.0f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T x) { *p = x; }
  static T set1(float x) { return x; }
  static T fma(T a, T b, T c) { return std::fma(a, b, c); }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T max(T a, T b) { return a > b ? a : b; }  // vmaxps: the second operand unless a > b
  static T min(T a, T b) { return a < b ? a : b; }  // vminps: the second operand unless a < b
  static T pow2(T n) {  // 2^n, n integral in [-126, 127]
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static T loadh(const uint16_t* p) { return half_to_float(*p); }
  static bool transpose(const float*, int64_t, int64_t, float*, int64_t) { return false; }
};

// exp(x) for x <= hi (clamped to [-87, hi], hi 0 or 88): n = round(x log2 e), r = x - n ln 2 in two
// parts (Cephes), a degree-7 polynomial, times 2^n. Only fma, mul, add, sub, min, max and an exact
// conversion: every path rounds the same.
template <class V>
inline typename V::T vexp(typename V::T x, float hi = 0.0f) {
  using T = typename V::T;
  x = V::max(x, V::set1(-87.0f));
  x = V::min(x, V::set1(hi));
  const T magic = V::set1(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer (half to even)
  const T n = V::sub(V::fma(x, V::set1(1.44269504088896341f), magic), magic);
  T r = V::fma(n, V::set1(-0.693359375f), x);
  r = V::fma(n, V::set1(2.12194440e-4f), r);
  T p = V::set1(1.9875691500e-4f);
  p = V::fma(p, r, V::set1(1.3981999507e-3f));
  p = V::fma(p, r, V::set1(8.3334519073e-3f));
  p = V::fma(p, r, V::set1(4.1665795894e-2f));
  p = V::fma(p, r, V::set1(1.6666665459e-1f));
  p = V::fma(p, r, V::set1(5.0000001201e-1f));
  T y = V::fma(p, V::mul(r, r), r);
  y = V::add(y, V::set1(1.0f));
  return V::mul(y, V::pow2(n));
}

}  // namespace
}  // namespace rowop

// A vector policy NAME over the register type REG of LANES floats whose intrinsics are P<op>_ps and
// whose integers are S (V8: _mm256, si256; V16: _mm512, si512), one instruction each; loadh widens
// LANES halves that HALF_LOAD reads as a HALF_T. Its transpose (the attention's key tiles) is its own.
#define ROWOP_VEC_POLICY(NAME, REG, LANES, P, S, HALF_LOAD, HALF_T)                                   \
  struct NAME {                                                                                     \
    using T = REG;                                                                                  \
    static constexpr int W = LANES;                                                                 \
    static T zero() { return P##_setzero_ps(); }                                                    \
    static T load(const float* p) { return P##_loadu_ps(p); }                                       \
    static T loadh(const uint16_t* p) { return P##_cvtph_ps(HALF_LOAD(reinterpret_cast<const HALF_T*>(p))); } \
    static void store(float* p, T x) { P##_storeu_ps(p, x); }                                       \
    static T set1(float x) { return P##_set1_ps(x); }                                               \
    static T fma(T a, T b, T c) { return P##_fmadd_ps(a, b, c); }                                   \
    static T add(T a, T b) { return P##_add_ps(a, b); }                                             \
    static T sub(T a, T b) { return P##_sub_ps(a, b); }                                             \
    static T mul(T a, T b) { return P##_mul_ps(a, b); }                                             \
    static T div(T a, T b) { return P##_div_ps(a, b); }                                             \
    static T max(T a, T b) { return P##_max_ps(a, b); }                                             \
    static T min(T a, T b) { return P##_min_ps(a, b); }                                             \
    static T pow2(T n) { /* 2^n, n integral in [-126, 127] */                                       \
      const auto e = P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127));                        \
      return P##_cast##S##_ps(P##_slli_epi32(e, 23));                                               \
    }                                                                                               \
    /* 16 keys x D into kt [D, ldk], transposed in registers (false: D does not suit) */           \
    static bool transpose(const float* src, int64_t ld, int64_t D, float* kt, int64_t ldk);          \
  };
