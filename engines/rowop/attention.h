// edgespec's exact attention (the op RowAttention, domain edgespec.rowop): one call's query rows
// against the cache window and the call's own new keys, each row's arithmetic fixed by the logical
// positions of its keys alone, so its bits do not depend on the call's width, on the other rows, on
// tree against chain, nor on the instruction-set path.
//
// Row t of the call (its new keys: its ancestors in depth order, then t; a chain: rows 0..t), query
// head h (kv head g = h / (Hq / Hkv)), at position pos = past + (its new keys) - 1, sees the positions
// [lo, pos]: lo = 0, or pos - window + 1 (a sliding layer's key window); cached positions [lo, past)
// from the window, positions past + i from its i-th new key. Then, in float32:
//   s_j   = dot(q, k_j) * scale        dot: acc = fma(q[d], k_j[d], acc) for d = 0, 1, .. D-1 from +0
//   m     = max_j s_j
//   e_j   = exp(s_j - m)                edgespec's exp (attention_impl.h: vexp), the same in every path
//   sum   = the e_j added in 16 lanes by position mod 16 (each lane in position order, from +0), then
//           the lanes halved 8, 4, 2, 1: lane l += lane l + w
//   c[d]  = (fma over j in position order of e_j * v_j[d], from +0) / sum
// Every path (AVX-512, AVX2 with FMA, portable C++ with std::fma) computes these operations, each
// correctly rounded, so they agree bit for bit; the NumPy reference (rowop.attention.reference) is
// float64 and agrees to rounding.
//
// A half cache (kc16 / vc16, IEEE fp16): the window's rows are read as fp16 and widened exactly, and
// the call's own new keys and values are rounded to fp16 first (round to nearest even, as numpy's
// astype(float16), which is how the engine commits them), so every key a row sees is the same value
// whether it comes from the cache or from the call: the arithmetic above over those values.
#pragma once

#include <cstdint>
#include <cstring>

namespace rowop {

// fp16 -> fp32, exact (the vector paths widen with F16C / AVX-512, also exact).
static inline float attn_half_to_float(uint16_t h) {
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
static inline uint16_t attn_float_to_half(float f) {
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

static inline float attn_round_half(float f) { return attn_half_to_float(attn_float_to_half(f)); }

// One call of the op (row-major float32 tensors; rows of a kv head are (t, h) in token-major order).
struct AttnProblem {
  int64_t t = 0;  // new rows (tokens) of the call
  int64_t hq = 0, hkv = 0, d = 0;  // query heads, kv heads, head dimension
  int64_t past = 0;  // cached positions [0, past) of the window
  int64_t window = 0;  // 0: none; else a row at position p sees positions > p - window
  float scale = 1.0f;  // scores are dot * scale
  const float* q = nullptr;  // [T, Hq*D]
  const float* k = nullptr;  // [T, Hkv*D] the call's new keys
  const float* v = nullptr;  // [T, Hkv*D] the call's new values
  const float* kc = nullptr;  // [S, Hkv*D] the window's keys (rows < past are read)
  const float* vc = nullptr;  // [S, Hkv*D] the window's values
  const uint16_t* kc16 = nullptr;  // a half cache instead of kc / vc (then k and v are rounded to fp16 already)
  const uint16_t* vc16 = nullptr;
  const int32_t* keys = nullptr;  // [T, T]: row t's new keys in logical order, keys[t*T + i], i < n_keys[t]
  const int32_t* n_keys = nullptr;  // [T]: how many (its ancestors + 1)
  float* out = nullptr;  // [T, Hq*D]
  int64_t rows_per_task = 64;  // query rows of one kv head per task

  int64_t rows_per_head() const { return (hq / hkv) * t; }
  int64_t blocks_per_head() const { return (rows_per_head() + rows_per_task - 1) / rows_per_task; }
  int64_t tasks() const { return hkv * blocks_per_head(); }
};

// One task: kv head task / blocks_per_head(), its rows block task % blocks_per_head().
using AttnTaskFn = void (*)(const AttnProblem& pr, int64_t task);
// The gated MLP's activation (op RowSwiGLU): y[r, i] = (g / (1 + exp(-g))) * u for g = x[r, i],
// u = x[r, inter + i], rows [r0, r1) of x [rows, 2 inter]; exp: edgespec's (vexp, over [-87, 88]).
using SwiGluFn = void (*)(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y);

struct AttnIsa {
  const char* name;
  AttnTaskFn task;
  SwiGluFn swiglu;
};

// Each in its own translation unit, compiled for its instruction set (a_*.cc).
extern const AttnIsa kAttnPortable;
extern const AttnIsa kAttnAvx2;  // the AVX2 and AVX-VNNI paths (256-bit, FMA)
extern const AttnIsa kAttnAvx512;

}  // namespace rowop
