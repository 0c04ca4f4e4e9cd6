// The attention's AVX-512 path (attention_impl.h over 16-lane vectors).
#include <immintrin.h>

#include "attention_impl.h"

namespace rowop {
namespace {

struct V16 {
  using T = __m512;
  static constexpr int W = 16;
  static constexpr int kRowsDots = 8;  // 8 accumulators: FMA latency x throughput
  static constexpr int kRowsWide = 2;  // 2 rows x 4 tiles
  static constexpr int kWide = 4;
  static constexpr int kRowsCtx = 4;  // 4 rows x 4 vectors: 16 accumulators
  static constexpr int kVecsCtx = 4;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static T loadh(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T pow2(T n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }

  // 16 keys x D (D a multiple of 16) into kt [D, ldk]: 16x16 blocks transposed in registers.
  static bool transpose(const float* src, int64_t ld, int64_t D, float* kt, int64_t ldk) {
    if (D % 16) return false;
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512 r[16], t[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld + d0);
      for (int i = 0; i < 8; ++i) {  // per 128-bit lane: pairs of rows interleaved
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
      for (int i = 0; i < 4; ++i) {  // r[4i + c], lane L: rows 4i..4i+3 of column 4L + c
        const __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d a2 = _mm512_castps_pd(t[4 * i + 2]), a3 = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
      }
      for (int c = 0; c < 4; ++c) {  // a 4x4 transpose of 128-bit lanes: U_i = r[4i + c]
        const __m512 x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        const __m512 x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 x2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 x3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        float* o = kt + (d0 + c) * ldk;
        _mm512_storeu_ps(o, _mm512_shuffle_f32x4(x0, x2, 0x88));  // column c
        _mm512_storeu_ps(o + 4 * ldk, _mm512_shuffle_f32x4(x1, x3, 0x88));  // column 4 + c
        _mm512_storeu_ps(o + 8 * ldk, _mm512_shuffle_f32x4(x0, x2, 0xDD));  // column 8 + c
        _mm512_storeu_ps(o + 12 * ldk, _mm512_shuffle_f32x4(x1, x3, 0xDD));  // column 12 + c
      }
    }
    return true;
  }
};

}  // namespace

const AttnIsa kAttnAvx512 = {"avx512", attn_task<V16>, swiglu<V16>};

}  // namespace rowop
