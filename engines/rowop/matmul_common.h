// Helpers the matmul's instruction-set variants share: record offsets, fp16 scales, the quantization loop.
// static: each path's object file keeps its own copy, compiled with its own -m flags (an inline
// function would be one weak symbol, and the linker could hand the portable path the AVX2 copy).
#pragma once

#include <cstring>

#include "half.h"
#include "matmul.h"

namespace rowop {

// Bytes ahead of the record being unpacked that the kernels prefetch. Measured on an 8-bit LM head
// (30 MB, out of cache) at 9 rows: 3.0-3.4 ms without, 1.27 ms with (a record's lines requested
// together, ahead of use, instead of one load miss after another); 4-bit and in-cache: no change.
constexpr int kPrefetch = 4096;

static inline void prefetch_record(const uint8_t* p, int bytes) {
  for (int off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

namespace {

// A panel's records in order (blocks b = 0, 1, ...): enter(b) steps past the super-block header
// where block b starts one (sub) and requests the lines kPrefetch bytes ahead; next() leaves it.
struct RecordWalk {
  const uint8_t* rp;  // the current block's record
  const uint8_t* hp = nullptr;  // sub: its super-block's header
  const int rec, nsub, head;  // record bytes, blocks per super-block, header bytes
  const bool sub;
  RecordWalk(const Layout& L, const uint8_t* w, int64_t p)
      : rp(w + p * L.panel_bytes()), rec(L.record_bytes()), nsub(L.sub_blocks()), head(L.head_bytes()), sub(L.sub) {}
  const uint8_t* enter(int64_t b) {
    if (sub && b % nsub == 0) {
      hp = rp;
      rp += head;
    }
    prefetch_record(rp + kPrefetch, rec);
    return rp;
  }
  void next() { rp += rec; }
};

}  // namespace

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

// Code of input 4g + j, output n of one block's record (the layouts: matmul.h's Layout).
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
// m = -(Dmin mn), matmul.h).
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

// Rows [r0, r1) of x, one block at a time: Block quantizes one row-block (the scalar definition,
// matmul.h, or a variant's vector form of it), then its sums as fp32 and times the zero point.
template <void (*Block)(const float*, int, int8_t*, float*, int32_t*)>
static inline void quantize_rows(const float* x, int64_t k, int bs, int zp, int64_t m, int64_t r0, int64_t r1,
                                 int8_t* xq, float* s, int32_t* xsum, float* xsumf, int32_t* zsum) {
  const int64_t nb = k / bs;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i = b * m + r;
      Block(x + r * k + b * bs, bs, xq + i * bs, s + i, xsum + i);
      xsumf[i] = static_cast<float>(xsum[i]);
      zsum[i] = zp > 0 ? zp * xsum[i] : 0;
    }
  }
}

}  // namespace rowop
