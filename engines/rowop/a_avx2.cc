// The attention's AVX2 path (attention_impl.h over 8-lane vectors with FMA; F16C widens a half cache): the avx2 and avxvnni
// paths' attention.
#include <immintrin.h>

#include "attention_impl.h"

namespace rowop {
namespace {

struct V8 {
  using T = __m256;
  static constexpr int W = 8;
  static constexpr int kRowsDots = 4;  // 4 rows x 2 vectors: 8 accumulators
  static constexpr int kRowsWide = 1;  // 1 row x 4 tiles x 2 vectors
  static constexpr int kWide = 4;
  static constexpr int kRowsCtx = 2;  // 2 rows x 4 vectors: 8 accumulators
  static constexpr int kVecsCtx = 4;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static T loadh(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T pow2(T n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }

  // 16 keys x D (D a multiple of 8) into kt [D, ldk]: 8x8 blocks transposed in registers.
  static bool transpose(const float* src, int64_t ld, int64_t D, float* kt, int64_t ldk) {
    if (D % 8) return false;
    for (int half = 0; half < 2; ++half) {
      const float* s = src + half * 8 * ld;
      for (int64_t d0 = 0; d0 < D; d0 += 8) {
        __m256 r[8], t[8], u[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * ld + d0);
        for (int i = 0; i < 4; ++i) {
          t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
          t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 2; ++i) {  // u[4i + c], lane L: rows 4i..4i+3 of column 4L + c
          u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
          u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
          u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
          u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (int c = 0; c < 4; ++c) {
          float* o = kt + (d0 + c) * ldk + half * 8;
          _mm256_storeu_ps(o, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));  // column c
          _mm256_storeu_ps(o + 4 * ldk, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));  // column 4 + c
        }
      }
    }
    return true;
  }
};

}  // namespace

const AttnIsa kAttnAvx2 = {"avx2", attn_task<V8>, swiglu<V8>};

}  // namespace rowop
