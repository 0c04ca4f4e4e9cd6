// RowMatMul's AVX-VNNI variant (256-bit vpdpbusd without AVX-512: Alder Lake and later, Zen 5).
#include "matmul_ymm.h"

namespace rowop {
namespace {

struct DotVnni {
  template <int G, int BITS>
  static void prep(__m256i*) {}

  template <int G, int BITS>
  static __m256i dot(const __m256i* W, const int8_t* q, int32_t) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int g = 0; g < G; g += 2) {
      s0 = _mm256_dpbusd_avx_epi32(s0, W[g], bcast4(q + 4 * g));
      s1 = _mm256_dpbusd_avx_epi32(s1, W[g + 1], bcast4(q + 4 * g + 4));
    }
    return _mm256_add_epi32(s0, s1);
  }
};

}  // namespace

const MatmulIsa kMatmulAvxVnni = {quantize_rows<quantize_block_scalar>, panels_ymm<DotVnni>};

}  // namespace rowop
