// RowMatMul's AVX-512 VNNI variant: a panel of 16 outputs is one register; vpdpbusd multiplies the unsigned
// codes by four broadcast int8 inputs per lane. Each weight block is loaded and unpacked once per
// call and serves every row of the call (up to kRowChunk rows per pass).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "matmul_common.h"

namespace rowop {
namespace {

inline __m512 load16(const uint8_t* p, bool f16) {
  return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
             : _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

inline __m512i bcast4(const int8_t* q) {
  int32_t v;
  __builtin_memcpy(&v, q, 4);
  return _mm512_set1_epi32(v);
}

// NR rows (consecutive in the block-major buffer) against one unpacked block; two dot chains per
// row so consecutive vpdpbusd do not wait on each other.
template <int NR, int G, int ZPM, bool MINS>
inline void rows(const __m512i* W, __m512 d, __m512 mn, __m512i z, const Rows& x, int64_t i, int bs,
                 float* acc) {
  __m512i s0[NR], s1[NR];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) s0[r] = s1[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int g = 0; g < G; g += 2) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const int8_t* q = x.xq + (i + r) * bs + 4 * g;
      s0[r] = _mm512_dpbusd_epi32(s0[r], W[g], bcast4(q));
      s1[r] = _mm512_dpbusd_epi32(s1[r], W[g + 1], bcast4(q + 4));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    __m512i dot = _mm512_add_epi32(s0[r], s1[r]);
    if (ZPM == 1) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(x.zsum[i + r]));
    if (ZPM == 2) dot = _mm512_sub_epi32(dot, _mm512_mullo_epi32(z, _mm512_set1_epi32(x.xsum[i + r])));
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), d);
    if (MINS) f = _mm512_add_ps(f, _mm512_mul_ps(mn, _mm512_set1_ps(x.xsumf[i + r])));
    f = _mm512_mul_ps(f, _mm512_set1_ps(x.s[i + r]));
    float* a = acc + r * kPanel;
    _mm512_store_ps(a, _mm512_add_ps(_mm512_load_ps(a), f));
  }
}

template <int G, int BITS, int ZPM, bool MINS>
void panels_t(const Layout& L, const uint8_t* w, const Rows& x, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
              float* y, int64_t ldy) {
  const int64_t nb = L.blocks();
  const int bs = L.bs, sb = L.scale_bytes();
  const bool f16 = L.f16, sub = L.sub;
  alignas(64) float acc[kRowChunk * kPanel];
  const __m512i lo4 = _mm512_set1_epi8(0x0F), hi2 = _mm512_set1_epi8(0x30), hi1 = _mm512_set1_epi8(0x10);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n_here = std::min<int64_t>(kPanel, L.n - p * kPanel);
    const __mmask16 mask = static_cast<__mmask16>((1u << n_here) - 1);
    for (int64_t c0 = r0; c0 < r1; c0 += kRowChunk) {
      const int nr = static_cast<int>(std::min<int64_t>(r1 - c0, kRowChunk));
      for (int r = 0; r < nr; ++r) _mm512_store_ps(acc + r * kPanel, _mm512_setzero_ps());
      RecordWalk walk(L, w, p);
      for (int64_t b = 0; b < nb; ++b, walk.next()) {
        const uint8_t *rp = walk.enter(b), *hp = walk.hp;  // hp (sub): the super-block's header
        __m512i W[G];
        if (BITS == 8) {
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) W[g] = _mm512_loadu_si512(rp + 64 * g);
        } else {
#pragma GCC unroll 4
          for (int c = 0; c < G / 2; ++c) {
            const __m512i v = _mm512_loadu_si512(rp + 64 * c);
            W[c] = _mm512_and_si512(v, lo4);
            W[c + G / 2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
          }
          if (BITS == 6) {  // bits 2i..2i+1 of chunk c: bits 4..5 of group c + i G/4
#pragma GCC unroll 2
            for (int c = 0; c < G / 4; ++c) {
              const __m512i v = _mm512_loadu_si512(rp + 32 * G + 64 * c);
              W[c] = _mm512_or_si512(W[c], _mm512_and_si512(_mm512_slli_epi16(v, 4), hi2));
              W[c + G / 4] = _mm512_or_si512(W[c + G / 4], _mm512_and_si512(_mm512_slli_epi16(v, 2), hi2));
              W[c + G / 2] = _mm512_or_si512(W[c + G / 2], _mm512_and_si512(v, hi2));
              W[c + 3 * G / 4] = _mm512_or_si512(W[c + 3 * G / 4], _mm512_and_si512(_mm512_srli_epi16(v, 2), hi2));
            }
          }
          if (BITS == 5) {  // bit i: bit 4 of group i (blocks of 32)
            const __m512i v = _mm512_loadu_si512(rp + 32 * G);
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
              const __m512i t = g < 4 ? _mm512_slli_epi16(v, 4 - g) : _mm512_srli_epi16(v, g - 4);
              W[g] = _mm512_or_si512(W[g], _mm512_and_si512(t, hi1));
            }
          }
        }
        const uint8_t* sp = rp + 8 * G * BITS;
        __m512 d, mn = _mm512_setzero_ps();
        if (sub) {  // d = D sc, m = -(Dmin mn): exact products (matmul.h)
          d = _mm512_mul_ps(load16(hp, true), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp)))));
          if (MINS) {
            const __m512 t = _mm512_mul_ps(load16(hp + 32, true), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 16)))));
            mn = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), _mm512_set1_epi32(INT32_MIN)));
          }
        } else {
          d = load16(sp, f16);
          if (MINS) mn = load16(sp + sb, f16);
        }
        const __m512i z = ZPM == 2 ? _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                         sp + sb * (MINS ? 2 : 1))))
                                   : _mm512_setzero_si512();
        const int64_t i0 = b * x.m + c0;
        int r = 0;
        for (; r + 4 <= nr; r += 4) rows<4, G, ZPM, MINS>(W, d, mn, z, x, i0 + r, bs, acc + r * kPanel);
        for (; r < nr; ++r) rows<1, G, ZPM, MINS>(W, d, mn, z, x, i0 + r, bs, acc + r * kPanel);
      }
      for (int r = 0; r < nr; ++r) {
        float* out = y + (c0 + r) * ldy + p * kPanel;
        if (n_here == kPanel) {
          _mm512_storeu_ps(out, _mm512_load_ps(acc + r * kPanel));
        } else {
          _mm512_mask_storeu_ps(out, mask, _mm512_load_ps(acc + r * kPanel));
        }
      }
    }
  }
}

template <int G, int BITS>
PanelsFn pick_zp_mins(const Layout& L) {
  const int zpm = L.zp < 0 ? 2 : (L.zp > 0 ? 1 : 0);
  if (L.mins) {
    return zpm == 2 ? panels_t<G, BITS, 2, true> : zpm == 1 ? panels_t<G, BITS, 1, true> : panels_t<G, BITS, 0, true>;
  }
  return zpm == 2 ? panels_t<G, BITS, 2, false> : zpm == 1 ? panels_t<G, BITS, 1, false> : panels_t<G, BITS, 0, false>;
}

void panels(const Layout& L, const uint8_t* w, const Rows& x, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
            float* y, int64_t ldy) {
  PanelsFn f = L.bs == 32 ? (L.bits == 4   ? pick_zp_mins<8, 4>(L)
                             : L.bits == 5 ? pick_zp_mins<8, 5>(L)
                             : L.bits == 6 ? pick_zp_mins<8, 6>(L)
                                           : pick_zp_mins<8, 8>(L))
                          : (L.bits == 4 ? pick_zp_mins<4, 4>(L) : L.bits == 6 ? pick_zp_mins<4, 6>(L) : pick_zp_mins<4, 8>(L));
  f(L, w, x, r0, r1, p0, p1, y, ldy);
}

// One row-block: |x| max, the scale, int8 values and their sum (matmul.h's definition, 16 lanes).
inline void quantize_block(const float* xb, int bs, int8_t* q, float* s, int32_t* sum) {
  const __m512 v0 = _mm512_loadu_ps(xb);
  const __m512 v1 = bs == 32 ? _mm512_loadu_ps(xb + 16) : _mm512_setzero_ps();
  const float a = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float inv = a > 0.0f ? 127.0f / a : 0.0f;
  *s = a / 127.0f;
  const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i q0 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vinv)), hi), lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
  __m512i t = q0;
  if (bs == 32) {
    const __m512i q1 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vinv)), hi), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
    t = _mm512_add_epi32(t, q1);
  }
  *sum = _mm512_reduce_add_epi32(t);
}

}  // namespace

const MatmulIsa kMatmulAvx512Vnni = {quantize_rows<quantize_block>, panels};

}  // namespace rowop
