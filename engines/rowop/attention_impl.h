// The attention of attention.h written once over a vector policy V (vec.h: V16 AVX-512, V8 AVX2 + FMA,
// V1 scalar with std::fma), included by each variant's translation unit (attention_<isa>.cc) with its own flags.
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
#include "vec.h"

namespace rowop {

// How a task's work is blocked for a policy (the variants, attention_<isa>.cc, set their own; the
// scalar policy: one at a time).
struct Tiling {
  int rows_dots;  // rows per dots pass over one tile (accumulators: rows x 16 / W)
  int rows_wide;  // rows per pass over 4 tiles (the rows left over)
  int wide;  // tiles such a pass takes (1: none)
  int rows_ctx;  // rows per context pass (<= 4)
  int vecs_ctx;  // vectors of D per context pass
};
template <class V>
constexpr Tiling kTiling = {1, 1, 1, 1, 1};

namespace {

// n elements of a half row widened into dst (exact).
template <class V>
inline void widen(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(dst + i, V::loadh(src + i));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
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

  // nr rows against nt tiles of kt: blocks of rows_dots rows tile by tile, the rest rows_wide rows
  // at a time over all 4 tiles (enough independent sums either way).
  static void dots_rows(const float* kt, int nt, int64_t D, const float* const* q, int64_t nr, float scale,
                        float* const* s) {
    int64_t r = 0;
    constexpr Tiling tl = kTiling<V>;
    for (; r + tl.rows_dots <= nr; r += tl.rows_dots) {
      for (int j = 0; j < nt; ++j) dots<tl.rows_dots, 1>(kt + 16 * j, D, q + r, scale, s + r, 16 * j);
    }
    for (; r < nr;) {
      const bool pair = tl.rows_wide == 2 && r + 2 <= nr;
      if (nt == kTiles && tl.wide == kTiles) {
        if (pair) {
          dots<2, tl.wide>(kt, D, q + r, scale, s + r, 0);
        } else {
          dots<1, tl.wide>(kt, D, q + r, scale, s + r, 0);
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

  // acc[r] += e_r[p] v_p over the cached value rows p in [p0, p1), in order (kSkip: rows whose
  // window starts after p skip it).
  template <int RB, int NV, bool kSkip, class C>
  __attribute__((always_inline)) static inline void cached(const C* vc, int64_t ld, int64_t p0, int64_t p1,
                                                           int64_t base, const Row* rows, int64_t d0, T (&acc)[RB][NV]) {
    for (int64_t p = p0; p < p1; ++p) {
      const C* vr = vc + p * ld + d0;
      T vv[NV];
#pragma GCC unroll 8
      for (int k = 0; k < NV; ++k) vv[k] = loadc(vr + k * W);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        if (kSkip && p < rows[r].lo) continue;
        const T e = V::set1(rows[r].e[p - base]);
#pragma GCC unroll 8
        for (int k = 0; k < NV; ++k) acc[r][k] = V::fma(e, vv[k], acc[r][k]);
      }
    }
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
    cached<RB, NV, true>(vc, ld, lo_min, lo_max, base, rows, d0, acc);  // rows whose window starts later skip these
    cached<RB, NV, false>(vc, ld, std::max(lo_min, lo_max), past, base, rows, d0, acc);
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
    constexpr int nv = kTiling<V>.vecs_ctx;
    for (; d0 + nv * W <= D; d0 += nv * W) {
      context<RB, nv, C>(vc, vn, ld, past, base, rows, d0);
    }
    for (; d0 + W <= D; d0 += W) context<RB, 1, C>(vc, vn, ld, past, base, rows, d0);
    for (; d0 < D; ++d0) Kern<V1>::template context<RB, 1, C>(vc, vn, ld, past, base, rows, d0);
  }

  template <class C>
  static void context_rows(const C* vc, const float* vn, int64_t ld, int64_t past, int64_t base, Row* rows,
                           int64_t nr, int64_t D) {
    int64_t r = 0;
    constexpr int rc = kTiling<V>.rows_ctx;
    for (; r + rc <= nr; r += rc) context_all<rc, C>(vc, vn, ld, past, base, rows + r, D);
    switch (nr - r) {  // rows_ctx <= 4
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
