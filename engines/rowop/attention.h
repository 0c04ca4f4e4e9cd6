// edgespec's exact attention (the ops RowAttention and RowQkvAttention, domain edgespec.rowop): one call's query rows
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

namespace rowop {

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

// The variants, each in its own translation unit compiled for its instruction set (attention_<isa>.cc).
void attention_portable(const AttnProblem& pr, int64_t task);
void attention_avx2(const AttnProblem& pr, int64_t task);  // the avx2 and avxvnni paths' (256-bit, FMA)
void attention_avx512(const AttnProblem& pr, int64_t task);

}  // namespace rowop
