// IEEE fp16 <-> fp32, exact where it can be (widening) and round to nearest even (narrowing, as
// numpy's astype(float16)): the matmul's fp16 scales, the attention's half cache.
// static: each path's object file keeps its own copy, compiled with its own -m flags (an inline
// function would be one weak symbol, and the linker could hand the portable path an AVX copy).
#pragma once

#include <cstdint>
#include <cstring>

namespace rowop {

// fp16 -> fp32, exact (the vector paths widen with F16C / AVX-512, also exact).
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // a subnormal half: normalized
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

// fp32 -> fp16, round to nearest even (numpy's astype(float16)): overflow to inf, subnormals kept.
static inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((ax >> 13) & 0x3FFu);  // nan, quiet
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up (and inf): inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), round(|f| * 2^24)
    const uint32_t e = ax >> 23;
    if (e < 102) return sign;  // below 2^-25 (ties at 2^-25 go to even: zero)
    const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u, shift = 126 - e;  // shift in [14, 24]
    uint32_t q = mant >> shift;
    const uint32_t r = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (r > half || (r == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t h = (((ax >> 23) - 112) << 10) | ((ax & 0x7FFFFFu) >> 13);
  const uint32_t r = ax & 0x1FFFu;
  if (r > 0x1000u || (r == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return sign | static_cast<uint16_t>(h);
}

static inline float round_half(float f) { return half_to_float(float_to_half(f)); }

}  // namespace rowop
