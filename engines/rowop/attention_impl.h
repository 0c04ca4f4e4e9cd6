// The attention of attention.h written once over a vector policy V (V16: AVX-512, V8: AVX2 + FMA,
// V1: scalar with std::fma), included by each path's translation unit (a_*.cc) with its own flags.
// Everything here has internal linkage, so no path's code is merged into another's by the linker.
//
// Per task (one kv head, a block of its query rows):
//   1. scores: 16 cached keys at a time are transposed into a [D, 16] tile, then each row does D
//      broadcast-FMAs for their 16 scores (lane l: key l's dot, over d in order); the call's new keys
//      the same way into a [rows, T] table, then copied to the positions each row has them at;
//   2. per row: max, exp, the 16-lane sum (buffers are indexed by position - base, base a multiple
//      of 16, so a vector's lane is the position mod 16);
//   3. context: 4 (or 2) rows at a time over the cached values (each value row loaded once for them),
//      then each row's new values, in position order, vectorized over D.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention.h"

namespace rowop {
namespace {

// Scalar policy: the definition (std::fma rounds once, as vfmadd does).
struct V1 {
  using T = float;
  static constexpr int W = 1;
  static constexpr int kRowsDots = 1;  // rows per dots pass over one tile (accumulators: rows x 16 / W)
  static constexpr int kRowsWide = 1;  // rows per pass over 4 tiles (the rows left over)
  static constexpr int kWide = 1;  // tiles such a pass takes (1: none)
  static constexpr int kRowsCtx = 1;  // rows per context pass
  static constexpr int kVecsCtx = 1;  // vectors of D per context pass
  static T zero() { return 0.0f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T x) { *p = x; }
  static T set1(float x) { return x; }
  static T fma(T a, T b, T c) { return std::fma(a, b, c); }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T max(T a, T b) { return a > b ? a : b; }  // vmaxps: the second operand unless a > b
  static T min(T a, T b) { return a < b ? a : b; }  // vminps: the second operand unless a < b
  static T pow2(T n) {  // 2^n, n integral in [-126, 127]
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static T loadh(const uint16_t* p) { return attn_half_to_float(*p); }
  static bool transpose(const float*, int64_t, int64_t, float*, int64_t) { return false; }
};

// n elements of a half row widened into dst (exact).
template <class V>
inline void widen(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(dst + i, V::loadh(src + i));
  for (; i < n; ++i) dst[i] = attn_half_to_float(src[i]);
}

// exp(x) for x <= hi (clamped to [-87, hi], hi 0 or 88): n = round(x log2 e), r = x - n ln 2 in two
// parts (Cephes), a degree-7 polynomial, times 2^n. Only fma, mul, add, sub, min, max and an exact
// conversion: every path rounds the same.
template <class V>
inline typename V::T vexp(typename V::T x, float hi = 0.0f) {
  using T = typename V::T;
  x = V::max(x, V::set1(-87.0f));
  x = V::min(x, V::set1(hi));
  const T magic = V::set1(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer (half to even)
  const T n = V::sub(V::fma(x, V::set1(1.44269504088896341f), magic), magic);
  T r = V::fma(n, V::set1(-0.693359375f), x);
  r = V::fma(n, V::set1(2.12194440e-4f), r);
  T p = V::set1(1.9875691500e-4f);
  p = V::fma(p, r, V::set1(1.3981999507e-3f));
  p = V::fma(p, r, V::set1(8.3334519073e-3f));
  p = V::fma(p, r, V::set1(4.1665795894e-2f));
  p = V::fma(p, r, V::set1(1.6666665459e-1f));
  p = V::fma(p, r, V::set1(5.0000001201e-1f));
  T y = V::fma(p, V::mul(r, r), r);
  y = V::add(y, V::set1(1.0f));
  return V::mul(y, V::pow2(n));
}

constexpr int kTiles = 4;  // 16-key tiles transposed at a time: kt is [D, 64]
constexpr int kLdk = 16 * kTiles;

// Keys src[l * ld + d] (l < n, d < D) into the tile kt[d * ldk + l], zero for l >= n.
template <class V>
inline void tile(const float* src, int64_t ld, int n, int64_t D, float* kt, int64_t ldk) {
  if (n == 16 && V::transpose(src, ld, D, kt, ldk)) return;
  for (int l = 0; l < n; ++l) {
    for (int64_t d = 0; d < D; ++d) kt[d * ldk + l] = src[l * ld + d];
  }
  for (int l = n; l < 16; ++l) {
    for (int64_t d = 0; d < D; ++d) kt[d * ldk + l] = 0.0f;
  }
}

// Half keys: the n rows widened into buf [16, D] first, then tiled as floats.
template <class V>
inline void tile(const uint16_t* src, int64_t ld, int n, int64_t D, float* kt, int64_t ldk, float* buf) {
  for (int l = 0; l < n; ++l) widen<V>(src + l * ld, D, buf + l * D);
  tile<V>(buf, D, n, D, kt, ldk);
}
template <class V>
inline void tile(const float* src, int64_t ld, int n, int64_t D, float* kt, int64_t ldk, float*) {
  tile<V>(src, ld, n, D, kt, ldk);
}

// Keys [c0, c0 + 64) of src (rows < n_rows; float or half) into kt [D, 64]; returns the tiles filled.
// buf: [16, D] floats (half keys are widened there).
template <class V, class C>
inline int tiles(const C* src, int64_t ld, int64_t c0, int64_t n_rows, int64_t D, float* kt, float* buf) {
  int nt = 0;
  for (; nt < kTiles && c0 + 16 * nt < n_rows; ++nt) {
    const int n = static_cast<int>(std::min<int64_t>(16, n_rows - c0 - 16 * nt));
    tile<V>(src + (c0 + 16 * nt) * ld, ld, n, D, kt + 16 * nt, kLdk, buf);
  }
  return nt;
}

// One query row of a task.
struct Row {
  const float* q;  // [D] its query
  float* out;  // [D] its context
  float* e;  // its scores, then probabilities: e[position - base]
  const int32_t* keys;  // its new keys in logical order
  int64_t n;  // how many
  int64_t lo, pos;  // the positions it sees: [lo, pos]
  float sum;  // its exp sum
};

template <class V>
struct Kern {
  using T = typename V::T;
  static constexpr int W = V::W;
  static constexpr int NK = 16 / W;  // vectors per 16 lanes

  static T loadc(const float* p) { return V::load(p); }  // a cached value row: float, or half widened
  static T loadc(const uint16_t* p) { return V::loadh(p); }

  // The scores of RB rows against NT tiles of kt (16 NT keys): s[r][off + l] = dot(q[r], key l) * scale.
  // Every lane is one key's dot, over d in order: the same operations whatever RB and NT.
  template <int RB, int NT>
  static void dots(const float* kt, int64_t D, const float* const* q, float scale, float* const* s, int64_t off) {
    constexpr int NA = NT * NK;
    T acc[RB][NA];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
      for (int k = 0; k < NA; ++k) acc[r][k] = V::zero();
    }
    for (int64_t d = 0; d < D; ++d) {
      T kv[NA];
#pragma GCC unroll 16
      for (int k = 0; k < NA; ++k) kv[k] = V::load(kt + d * kLdk + k * W);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        const T qb = V::set1(q[r][d]);
#pragma GCC unroll 16
        for (int k = 0; k < NA; ++k) acc[r][k] = V::fma(qb, kv[k], acc[r][k]);
      }
    }
    const T sc = V::set1(scale);
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
      for (int k = 0; k < NA; ++k) V::store(s[r] + off + k * W, V::mul(acc[r][k], sc));
    }
  }

  // nr rows against nt tiles of kt: blocks of kRowsDots rows tile by tile, the rest kRowsWide rows
  // at a time over all 4 tiles (enough independent sums either way).
  static void dots_rows(const float* kt, int nt, int64_t D, const float* const* q, int64_t nr, float scale,
                        float* const* s) {
    int64_t r = 0;
    for (; r + V::kRowsDots <= nr; r += V::kRowsDots) {
      for (int j = 0; j < nt; ++j) dots<V::kRowsDots, 1>(kt + 16 * j, D, q + r, scale, s + r, 16 * j);
    }
    for (; r < nr;) {
      const bool pair = V::kRowsWide == 2 && r + 2 <= nr;
      if (nt == kTiles && V::kWide == kTiles) {
        if (pair) {
          dots<2, V::kWide>(kt, D, q + r, scale, s + r, 0);
        } else {
          dots<1, V::kWide>(kt, D, q + r, scale, s + r, 0);
        }
      } else {
        for (int j = 0; j < nt; ++j) {
          if (pair) {
            dots<2, 1>(kt + 16 * j, D, q + r, scale, s + r, 16 * j);
          } else {
            dots<1, 1>(kt + 16 * j, D, q + r, scale, s + r, 16 * j);
          }
        }
      }
      r += pair ? 2 : 1;
    }
  }

  // A row's scores e[lo - base .. pos - base] -> exp(s - max), zero elsewhere in their 16-groups;
  // returns the sum (16 lanes by position mod 16, then halved).
  static float softmax(Row& x, int64_t base) {
    const int64_t a = x.lo - base, b = x.pos - base;  // first and last index seen
    const int64_t g0 = a & ~int64_t{15}, g1 = (b | 15) + 1;
    float* e = x.e;
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t i = g0; i < a; ++i) e[i] = ninf;
    for (int64_t i = b + 1; i < g1; ++i) e[i] = ninf;
    T mv[NK];
    for (int k = 0; k < NK; ++k) mv[k] = V::set1(ninf);
    for (int64_t i = g0; i < g1; i += 16) {
#pragma GCC unroll 16
      for (int k = 0; k < NK; ++k) mv[k] = V::max(V::load(e + i + k * W), mv[k]);
    }
    alignas(64) float lanes[16];
    for (int k = 0; k < NK; ++k) V::store(lanes + k * W, mv[k]);
    float m = lanes[0];
    for (int l = 1; l < 16; ++l) m = lanes[l] > m ? lanes[l] : m;  // exact (a -0 / +0 tie: exp gives 1 either way)
    const T mm = V::set1(m);
    for (int64_t i = g0; i < g1; i += W) V::store(e + i, vexp<V>(V::sub(V::load(e + i), mm)));
    for (int64_t i = g0; i < a; ++i) e[i] = 0.0f;
    for (int64_t i = b + 1; i < g1; ++i) e[i] = 0.0f;
    T acc[NK];
    for (int k = 0; k < NK; ++k) acc[k] = V::zero();
    for (int64_t i = g0; i < g1; i += 16) {
#pragma GCC unroll 16
      for (int k = 0; k < NK; ++k) acc[k] = V::add(acc[k], V::load(e + i + k * W));
    }
    for (int k = 0; k < NK; ++k) V::store(lanes + k * W, acc[k]);
    for (int w = 8; w >= 1; w /= 2) {
      for (int l = 0; l < w; ++l) lanes[l] = lanes[l] + lanes[l + w];
    }
    return lanes[0];
  }

  // Context columns [d0, d0 + NV * W) of RB rows: the cached values (each row from its lo), then
  // each row's new values, in position order; divided by the row's sum.
  template <int RB, int NV, class C>
  static void context(const C* vc, const float* vn, int64_t ld, int64_t past, int64_t base, Row* rows,
                      int64_t d0) {
    T acc[RB][NV];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 8
      for (int k = 0; k < NV; ++k) acc[r][k] = V::zero();
    }
    int64_t lo_min = past, lo_max = 0;
    for (int r = 0; r < RB; ++r) {
      lo_min = std::min(lo_min, rows[r].lo);
      lo_max = std::max(lo_max, std::min(rows[r].lo, past));
    }
    for (int64_t p = lo_min; p < lo_max; ++p) {  // rows whose window starts later skip these
      const C* vr = vc + p * ld + d0;
      T vv[NV];
#pragma GCC unroll 8
      for (int k = 0; k < NV; ++k) vv[k] = loadc(vr + k * W);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        if (p < rows[r].lo) continue;
        const T e = V::set1(rows[r].e[p - base]);
#pragma GCC unroll 8
        for (int k = 0; k < NV; ++k) acc[r][k] = V::fma(e, vv[k], acc[r][k]);
      }
    }
    for (int64_t p = std::max(lo_min, lo_max); p < past; ++p) {
      const C* vr = vc + p * ld + d0;
      T vv[NV];
#pragma GCC unroll 8
      for (int k = 0; k < NV; ++k) vv[k] = loadc(vr + k * W);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        const T e = V::set1(rows[r].e[p - base]);
#pragma GCC unroll 8
        for (int k = 0; k < NV; ++k) acc[r][k] = V::fma(e, vv[k], acc[r][k]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const Row& x = rows[r];
      for (int64_t i = 0; i < x.n; ++i) {
        const int64_t p = past + i;
        if (p < x.lo) continue;
        const float* vr = vn + x.keys[i] * ld + d0;
        const T e = V::set1(x.e[p - base]);
#pragma GCC unroll 8
        for (int k = 0; k < NV; ++k) acc[r][k] = V::fma(e, V::load(vr + k * W), acc[r][k]);
      }
      const T s = V::set1(x.sum);
#pragma GCC unroll 8
      for (int k = 0; k < NV; ++k) V::store(x.out + d0 + k * W, V::div(acc[r][k], s));
    }
  }

  template <int RB, class C>
  static void context_all(const C* vc, const float* vn, int64_t ld, int64_t past, int64_t base, Row* rows,
                          int64_t D) {
    int64_t d0 = 0;
    for (; d0 + V::kVecsCtx * W <= D; d0 += V::kVecsCtx * W) {
      context<RB, V::kVecsCtx, C>(vc, vn, ld, past, base, rows, d0);
    }
    for (; d0 + W <= D; d0 += W) context<RB, 1, C>(vc, vn, ld, past, base, rows, d0);
    for (; d0 < D; ++d0) Kern<V1>::template context<RB, 1, C>(vc, vn, ld, past, base, rows, d0);
  }

  template <class C>
  static void context_rows(const C* vc, const float* vn, int64_t ld, int64_t past, int64_t base, Row* rows,
                           int64_t nr, int64_t D) {
    int64_t r = 0;
    for (; r + V::kRowsCtx <= nr; r += V::kRowsCtx) context_all<V::kRowsCtx, C>(vc, vn, ld, past, base, rows + r, D);
    switch (nr - r) {  // kRowsCtx <= 4
      case 3:
        context_all<3, C>(vc, vn, ld, past, base, rows + r, D);
        break;
      case 2:
        context_all<2, C>(vc, vn, ld, past, base, rows + r, D);
        break;
      case 1:
        context_all<1, C>(vc, vn, ld, past, base, rows + r, D);
        break;
      default:
        break;
    }
  }
};

// RowSwiGLU's rows (attention.h SwiGluFn): vectors of W, the tail one by one.
template <class V>
void swiglu(const float* x, int64_t inter, int64_t r0, int64_t r1, float* y) {
  using T = typename V::T;
  const T one = V::set1(1.0f), zero = V::zero();
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = x + r * 2 * inter;
    const float* u = g + inter;
    float* o = y + r * inter;
    int64_t i = 0;
    for (; i + V::W <= inter; i += V::W) {
      const T gv = V::load(g + i);
      const T s = V::div(gv, V::add(one, vexp<V>(V::sub(zero, gv), 88.0f)));
      V::store(o + i, V::mul(s, V::load(u + i)));
    }
    for (; i < inter; ++i) {
      const float s = g[i] / (1.0f + vexp<V1>(0.0f - g[i], 88.0f));
      o[i] = s * u[i];
    }
  }
}

// Per calling thread, grown once.
struct AttnScratch {
  std::vector<float> e, dn, kt, kh;  // kh: 16 half keys widened
  std::vector<Row> rows;
  std::vector<const float*> q;
  std::vector<float*> s;
};
thread_local AttnScratch t_attn;

template <class V, class C>
void attn_task(const AttnProblem& pr, int64_t task, const C* kc, const C* vc) {
  const int64_t G = pr.hq / pr.hkv, per_head = pr.rows_per_head(), nblk = pr.blocks_per_head();
  const int64_t g = task / nblk, r0 = (task % nblk) * pr.rows_per_task;
  const int64_t nr = std::min(per_head, r0 + pr.rows_per_task) - r0;
  if (nr <= 0) return;
  const int64_t D = pr.d, ld = pr.hkv * D, ldq = pr.hq * D, T = pr.t, past = pr.past;
  AttnScratch& sc = t_attn;
  if (static_cast<int64_t>(sc.rows.size()) < nr) {
    sc.rows.resize(nr);
    sc.q.resize(nr);
    sc.s.resize(nr);
  }
  Row* rows = sc.rows.data();
  int64_t lo_min = INT64_MAX, top = 0, cmax = 0;
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = r0 + i, t = r / G, h = g * G + r % G;
    Row& x = rows[i];
    x.q = pr.q + t * ldq + h * D;
    x.out = pr.out + t * ldq + h * D;
    x.keys = pr.keys + t * T;
    x.n = pr.n_keys[t];
    x.pos = past + x.n - 1;
    x.lo = pr.window > 0 ? std::max<int64_t>(0, x.pos - pr.window + 1) : 0;
    lo_min = std::min(lo_min, x.lo);
    top = std::max(top, x.pos);
    for (int64_t j = 0; j < x.n; ++j) cmax = std::max<int64_t>(cmax, x.keys[j]);
    sc.q[i] = x.q;
  }
  const int64_t base = lo_min & ~int64_t{15};
  const int64_t L = ((top - base) | 15) + 1;  // scores per row: positions [base, base + L)
  const int64_t TN = (cmax | 15) + 1;  // new-key scores per row
  const size_t need_e = static_cast<size_t>(nr * L), need_dn = static_cast<size_t>(nr * TN);
  if (sc.e.size() < need_e) sc.e.resize(need_e);
  if (sc.dn.size() < need_dn) sc.dn.resize(need_dn);
  if (sc.kt.size() < static_cast<size_t>(kLdk * D)) sc.kt.resize(kLdk * D);
  if (sc.kh.size() < static_cast<size_t>(16 * D)) sc.kh.resize(16 * D);
  float* kt = sc.kt.data();
  for (int64_t i = 0; i < nr; ++i) rows[i].e = sc.e.data() + i * L;

  // 1. scores of the cached positions [base, past), 64 at a time
  for (int64_t j0 = base; j0 < past; j0 += kLdk) {
    const int nt = tiles<V>(kc + g * D, ld, j0, past, D, kt, sc.kh.data());
    for (int64_t i = 0; i < nr; ++i) sc.s[i] = rows[i].e + (j0 - base);
    Kern<V>::dots_rows(kt, nt, D, sc.q.data(), nr, pr.scale, sc.s.data());
  }
  // ... and of the new keys [0, cmax], then each row's at the positions past + i
  for (int64_t c0 = 0; c0 <= cmax; c0 += kLdk) {
    const int nt = tiles<V>(pr.k + g * D, ld, c0, cmax + 1, D, kt, sc.kh.data());
    for (int64_t i = 0; i < nr; ++i) sc.s[i] = sc.dn.data() + i * TN + c0;
    Kern<V>::dots_rows(kt, nt, D, sc.q.data(), nr, pr.scale, sc.s.data());
  }
  for (int64_t i = 0; i < nr; ++i) {
    Row& x = rows[i];
    const float* dn = sc.dn.data() + i * TN;
    for (int64_t j = 0; j < x.n; ++j) {
      if (past + j >= x.lo) x.e[past + j - base] = dn[x.keys[j]];  // base <= lo: the ones it sees
    }
  }
  // 2. probabilities
  for (int64_t i = 0; i < nr; ++i) rows[i].sum = Kern<V>::softmax(rows[i], base);
  // 3. context
  Kern<V>::context_rows(vc + g * D, pr.v + g * D, ld, past, base, rows, nr, D);
}

// One task over the float or the half cache.
template <class V>
void attn_task(const AttnProblem& pr, int64_t task) {
  if (pr.kc16 != nullptr) {
    attn_task<V, uint16_t>(pr, task, pr.kc16, pr.vc16);
  } else {
    attn_task<V, float>(pr, task, pr.kc, pr.vc);
  }
}

}  // namespace
}  // namespace rowop
