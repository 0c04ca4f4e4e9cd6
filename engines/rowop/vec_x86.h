// The x86 vector policies (vec.h's operations, one instruction each, and the attention's key
// transposes), each defined in the translation units compiled for it: V8 over __m256 (the avx2 and
// avxvnni paths: AVX2 + FMA, F16C widening a half cache), V16 over __m512 (AVX-512F).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "vec.h"

namespace rowop {
namespace {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
ROWOP_VEC_POLICY(V8, __m256, 8, _mm256, si256, _mm_loadu_si128, __m128i)

// 16 keys x D (D a multiple of 8) into kt [D, ldk]: 8x8 blocks transposed in registers.
inline bool V8::transpose(const float* src, int64_t ld, int64_t D, float* kt, int64_t ldk) {
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
#endif

#if defined(__AVX512F__)
ROWOP_VEC_POLICY(V16, __m512, 16, _mm512, si512, _mm256_loadu_si256, __m256i)

// 16 keys x D (D a multiple of 16) into kt [D, ldk]: 16x16 blocks transposed in registers.
inline bool V16::transpose(const float* src, int64_t ld, int64_t D, float* kt, int64_t ldk) {
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
#endif

}  // namespace
}  // namespace rowop
