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

// Output row n of a packed linear as floats (RowGather: an embedding table read from its tied LM
// head's bytes): w[k] = float(code - z) * d (+ m), fp32, one rounding per operation, for k in [0, K).
static inline void gather_row(const Layout& L, const uint8_t* w, int64_t n, float* out) {
  const int64_t nb = L.blocks(), p = n / kPanel;
  const int lane = static_cast<int>(n % kPanel), groups = L.bs / 4, half = groups / 2, rec = L.record_bytes();
  float d[kPanel], mn[kPanel];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rp = w + (p * nb + b) * rec;
    const uint8_t* sp = rp + L.code_bytes();
    load_scales(sp, L.f16, d);
    if (L.mins) load_scales(sp + L.scale_bytes(), L.f16, mn);
    const int z = L.zp < 0 ? sp[L.scale_bytes() * (L.mins ? 2 : 1) + lane] : L.zp;
    float* o = out + b * L.bs;
    for (int g = 0; g < groups; ++g) {
      for (int j = 0; j < 4; ++j) {
        int c;
        if (L.bits == 8) {
          c = rp[64 * g + 4 * lane + j];
        } else {
          const uint8_t byte = rp[64 * (g % half) + 4 * lane + j];
          c = g < half ? (byte & 0x0F) : (byte >> 4);
        }
        float v = static_cast<float>(c - z) * d[lane];
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
