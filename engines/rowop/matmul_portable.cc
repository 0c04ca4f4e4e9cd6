// RowMatMul's portable variant: plain C++, the arithmetic of matmul.h written out (any CPU).
#include <algorithm>
#include <vector>

#include "matmul_common.h"

namespace rowop {
namespace {

void panels(const Layout& L, const uint8_t* w, const Rows& x, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
            float* y, int64_t ldy) {
  const int64_t nb = L.blocks();
  const int bs = L.bs, groups = bs / 4;
  int32_t codes[kPanel][32];  // [output][input] of one block
  float d[kPanel], mn[kPanel];
  int32_t z[kPanel];
  std::vector<float> acc(static_cast<size_t>(r1 - r0) * kPanel);
  for (int64_t p = p0; p < p1; ++p) {
    const int n_here = static_cast<int>(L.n - p * kPanel < kPanel ? L.n - p * kPanel : kPanel);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* rp = L.record(w, p, b);
      for (int g = 0; g < groups; ++g) {
        for (int n = 0; n < kPanel; ++n) {
          for (int j = 0; j < 4; ++j) codes[n][4 * g + j] = code_at(L, rp, g, n, j);
        }
      }
      block_factors(L, rp, block_header(L, w, p, b), d, mn, z);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = b * x.m + r;
        const int8_t* q = x.xq + i * bs;
        float* a = acc.data() + (r - r0) * kPanel;
        for (int n = 0; n < kPanel; ++n) {
          int32_t dot = 0;
          for (int kk = 0; kk < bs; ++kk) dot += static_cast<int32_t>(q[kk]) * codes[n][kk];
          dot -= L.zp < 0 ? z[n] * x.xsum[i] : x.zsum[i];
          float f = static_cast<float>(dot) * d[n];
          if (L.mins) f = f + mn[n] * x.xsumf[i];
          a[n] = a[n] + f * x.s[i];
        }
      }
    }
    for (int64_t r = r0; r < r1; ++r) {
      for (int n = 0; n < n_here; ++n) y[r * ldy + p * kPanel + n] = acc[(r - r0) * kPanel + n];
    }
  }
}

}  // namespace

const MatmulIsa kMatmulPortable = {quantize_rows<quantize_block_scalar>, panels};

}  // namespace rowop
