// RowMatMul's 256-bit variants (AVX-VNNI, AVX2): a 16-output panel is processed as two halves of 8 lanes
// (bytes 32h .. 32h + 31 of each 64-byte code chunk). The Dot policy computes one row's exact
// int32 sums sum_k xq[k] * code[k, n] for the 8 outputs of a half from the unpacked codes.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "matmul_common.h"

namespace rowop {
namespace {

inline __m256i bcast4(const int8_t* q) {
  int32_t v;
  __builtin_memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 load8(const uint8_t* p, bool f16) {
  return f16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
             : _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

template <class Dot, int G, int BITS, int ZPM, bool MINS>
void panels_t(const Layout& L, const uint8_t* w, const Rows& x, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
              float* y, int64_t ldy) {
  const int64_t nb = L.blocks();
  const int bs = L.bs, sb = L.scale_bytes();
  const int es = L.f16 ? 2 : 4;  // bytes per scale
  const bool f16 = L.f16, sub = L.sub;
  alignas(32) float acc[kRowChunk * 8];
  const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30), hi1 = _mm256_set1_epi8(0x10);
  for (int64_t p = p0; p < p1; ++p) {
    for (int h = 0; h < 2; ++h) {
      const int64_t n_here = std::min<int64_t>(8, L.n - p * kPanel - 8 * h);
      if (n_here <= 0) break;
      for (int64_t c0 = r0; c0 < r1; c0 += kRowChunk) {
        const int nr = static_cast<int>(std::min<int64_t>(r1 - c0, kRowChunk));
        for (int r = 0; r < nr; ++r) _mm256_store_ps(acc + r * 8, _mm256_setzero_ps());
        RecordWalk walk(L, w, p);
        for (int64_t b = 0; b < nb; ++b, walk.next()) {
          const uint8_t *rp = walk.enter(b), *hp = walk.hp;  // hp (sub): the super-block's header
          __m256i W[2 * G];  // the policy may keep a second form of the codes in W[G..2G)
          if (BITS == 8) {
            for (int g = 0; g < G; ++g) W[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp + 64 * g + 32 * h));
          } else {
            for (int c = 0; c < G / 2; ++c) {
              const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp + 64 * c + 32 * h));
              W[c] = _mm256_and_si256(v, lo4);
              W[c + G / 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            }
            if (BITS == 6) {  // bits 2i..2i+1 of chunk c: bits 4..5 of group c + i G/4
              for (int c = 0; c < G / 4; ++c) {
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp + 32 * G + 64 * c + 32 * h));
                W[c] = _mm256_or_si256(W[c], _mm256_and_si256(_mm256_slli_epi16(v, 4), hi2));
                W[c + G / 4] = _mm256_or_si256(W[c + G / 4], _mm256_and_si256(_mm256_slli_epi16(v, 2), hi2));
                W[c + G / 2] = _mm256_or_si256(W[c + G / 2], _mm256_and_si256(v, hi2));
                W[c + 3 * G / 4] = _mm256_or_si256(W[c + 3 * G / 4], _mm256_and_si256(_mm256_srli_epi16(v, 2), hi2));
              }
            }
            if (BITS == 5) {  // bit i: bit 4 of group i (blocks of 32)
              const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp + 32 * G + 32 * h));
              for (int g = 0; g < G; ++g) {
                const __m256i t = g < 4 ? _mm256_slli_epi16(v, 4 - g) : _mm256_srli_epi16(v, g - 4);
                W[g] = _mm256_or_si256(W[g], _mm256_and_si256(t, hi1));
              }
            }
          }
          Dot::template prep<G, BITS>(W);
          const uint8_t* sp = rp + 8 * G * BITS;
          __m256 d, mn = _mm256_setzero_ps();
          if (sub) {  // d = D sc, m = -(Dmin mn): exact products (matmul.h)
            d = _mm256_mul_ps(load8(hp + 16 * h, true), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                           _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp + 8 * h)))));
            if (MINS) {
              const __m256 t = _mm256_mul_ps(load8(hp + 32 + 16 * h, true), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp + 16 + 8 * h)))));
              mn = _mm256_xor_ps(t, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)));
            }
          } else {
            d = load8(sp + 8 * h * es, f16);
            if (MINS) mn = load8(sp + sb + 8 * h * es, f16);
          }
          __m256i z = _mm256_setzero_si256();
          if (ZPM == 2) {
            z = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp + sb * (MINS ? 2 : 1) + 8 * h)));
          }
          const int64_t i0 = b * x.m + c0;
          for (int r = 0; r < nr; ++r) {
            const int64_t i = i0 + r;
            __m256i dot = Dot::template dot<G, BITS>(W, x.xq + i * bs, x.xsum[i]);
            if (ZPM == 1) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(x.zsum[i]));
            if (ZPM == 2) dot = _mm256_sub_epi32(dot, _mm256_mullo_epi32(z, _mm256_set1_epi32(x.xsum[i])));
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), d);
            if (MINS) f = _mm256_add_ps(f, _mm256_mul_ps(mn, _mm256_set1_ps(x.xsumf[i])));
            f = _mm256_mul_ps(f, _mm256_set1_ps(x.s[i]));
            float* a = acc + r * 8;
            _mm256_store_ps(a, _mm256_add_ps(_mm256_load_ps(a), f));
          }
        }
        for (int r = 0; r < nr; ++r) {
          float* out = y + (c0 + r) * ldy + p * kPanel + 8 * h;
          if (n_here == 8) {
            _mm256_storeu_ps(out, _mm256_load_ps(acc + r * 8));
          } else {
            for (int n = 0; n < n_here; ++n) out[n] = acc[r * 8 + n];
          }
        }
      }
    }
  }
}

template <class Dot, int G, int BITS>
PanelsFn pick_zp_mins(const Layout& L) {
  const int zpm = L.zp < 0 ? 2 : (L.zp > 0 ? 1 : 0);
  if (L.mins) {
    return zpm == 2   ? panels_t<Dot, G, BITS, 2, true>
           : zpm == 1 ? panels_t<Dot, G, BITS, 1, true>
                      : panels_t<Dot, G, BITS, 0, true>;
  }
  return zpm == 2 ? panels_t<Dot, G, BITS, 2, false>
         : zpm == 1 ? panels_t<Dot, G, BITS, 1, false>
                    : panels_t<Dot, G, BITS, 0, false>;
}

template <class Dot>
void panels_ymm(const Layout& L, const uint8_t* w, const Rows& x, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
                float* y, int64_t ldy) {
  PanelsFn f = L.bs == 32 ? (L.bits == 4   ? pick_zp_mins<Dot, 8, 4>(L)
                             : L.bits == 5 ? pick_zp_mins<Dot, 8, 5>(L)
                             : L.bits == 6 ? pick_zp_mins<Dot, 8, 6>(L)
                                           : pick_zp_mins<Dot, 8, 8>(L))
                          : (L.bits == 4   ? pick_zp_mins<Dot, 4, 4>(L)
                             : L.bits == 6 ? pick_zp_mins<Dot, 4, 6>(L)
                                           : pick_zp_mins<Dot, 4, 8>(L));
  f(L, w, x, r0, r1, p0, p1, y, ldy);
}

}  // namespace
}  // namespace rowop
