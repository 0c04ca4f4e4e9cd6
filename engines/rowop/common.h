// Helpers the instruction-set paths share: record offsets, fp16 scales, the portable quantization.
// static: each path's object file keeps its own copy, compiled with its own -m flags (an inline
// function would be one weak symbol, and the linker could hand the portable path the AVX2 copy).
#pragma once

#include <cstring>

#include "rowop.h"

namespace rowop {

// Bytes ahead of the record being unpacked that the kernels prefetch. Measured on an 8-bit LM head
// (30 MB, out of cache) at 9 rows: 3.0-3.4 ms without, 1.27 ms with (a record's lines requested
// together, ahead of use, instead of one load miss after another); 4-bit and in-cache: no change.
constexpr int kPrefetch = 4096;

static inline void prefetch_record(const uint8_t* p, int bytes) {
  for (int off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// fp16 -> fp32, exact (the vector paths convert with F16C / AVX-512, also exact).
static inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    bits = sign | ((112 - e) << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Scales (or mins) of one record, 16 of them, as fp32.
static inline void load_scales(const uint8_t* p, bool f16, float* out) {
  if (f16) {
    for (int i = 0; i < kPanel; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = half_to_float(h);
    }
  } else {
    std::memcpy(out, p, kPanel * 4);
  }
}

// Code of input 4g + j, output n of one block's record (the layouts: rowop.h's Layout).
static inline int code_at(const Layout& L, const uint8_t* rp, int g, int n, int j) {
  const int groups = L.bs / 4, at = 4 * n + j;
  if (L.bits == 8) return rp[64 * g + at];
  const int half = groups / 2;  // chunk c holds group c (low nibbles) and c + half (high)
  const uint8_t byte = rp[64 * (g % half) + at];
  int c = g < half ? (byte & 0x0F) : (byte >> 4);
  const uint8_t* hi = rp + groups * 32;  // the high bits, after the low nibbles
  if (L.bits == 6) {
    const int q = groups / 4;
    c |= ((hi[64 * (g % q) + at] >> (2 * (g / q))) & 3) << 4;
  } else if (L.bits == 5) {
    c |= ((hi[at] >> g) & 1) << 4;
  }
  return c;
}

// A block's scales d, minimums m (with L.mins) and zero points z as fp32 / int for its 16 outputs:
// read from the record rp (sub: from its sub-scale codes and the super-block header hp: d = D sc,
// m = -(Dmin mn), rowop.h).
static inline void block_factors(const Layout& L, const uint8_t* rp, const uint8_t* hp, float* d, float* mn,
                                 int32_t* z) {
  const uint8_t* sp = rp + L.code_bytes();
  if (L.sub) {
    float dh[kPanel], mh[kPanel];
    load_scales(hp, true, dh);
    if (L.mins) load_scales(hp + 2 * kPanel, true, mh);
    for (int i = 0; i < kPanel; ++i) {
      d[i] = dh[i] * static_cast<float>(static_cast<int8_t>(sp[i]));
      if (L.mins) mn[i] = -(mh[i] * static_cast<float>(static_cast<int8_t>(sp[kPanel + i])));
      z[i] = L.zp;
    }
    return;
  }
  load_scales(sp, L.f16, d);
  if (L.mins) load_scales(sp + L.scale_bytes(), L.f16, mn);
  const uint8_t* zp = sp + L.scale_bytes() * (L.mins ? 2 : 1);
  for (int i = 0; i < kPanel; ++i) z[i] = L.zp < 0 ? zp[i] : L.zp;
}

// The super-block header of block b in panel p (sub), else nullptr.
static inline const uint8_t* block_header(const Layout& L, const uint8_t* w, int64_t p, int64_t b) {
  if (!L.sub) return nullptr;
  const int64_t s = b / L.sub_blocks();
  return w + p * L.panel_bytes() + s * (L.head_bytes() + L.sub_blocks() * static_cast<int64_t>(L.record_bytes()));
}

// Output row n of a packed linear as floats (RowGather: an embedding table read from its tied LM
// head's bytes): w[k] = float(code - z) * d (+ m), fp32, one rounding per operation, for k in [0, K).
static inline void gather_row(const Layout& L, const uint8_t* w, int64_t n, float* out) {
  const int64_t nb = L.blocks(), p = n / kPanel;
  const int lane = static_cast<int>(n % kPanel), groups = L.bs / 4;
  float d[kPanel], mn[kPanel];
  int32_t z[kPanel];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rp = L.record(w, p, b);
    block_factors(L, rp, block_header(L, w, p, b), d, mn, z);
    float* o = out + b * L.bs;
    for (int g = 0; g < groups; ++g) {
      for (int j = 0; j < 4; ++j) {
        float v = static_cast<float>(code_at(L, rp, g, lane, j) - z[lane]) * d[lane];
        if (L.mins) v = v + mn[lane];
        o[4 * g + j] = v;
      }
    }
  }
}

// Rows [r0, r1) of x, one block at a time, by the scalar definition (rowop.h).
static inline void quantize_rows_scalar(const float* x, int64_t k, int bs, int zp, int64_t m, int64_t r0, int64_t r1,
                                 int8_t* xq, float* s, int32_t* xsum, float* xsumf, int32_t* zsum) {
  const int64_t nb = k / bs;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i = b * m + r;
      quantize_block_scalar(x + r * k + b * bs, bs, xq + i * bs, s + i, xsum + i);
      xsumf[i] = static_cast<float>(xsum[i]);
      zsum[i] = zp > 0 ? zp * xsum[i] : 0;
    }
  }
}

}  // namespace rowop
