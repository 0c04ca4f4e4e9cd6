// RowMatMul's AVX2 variant (no VNNI): vpmaddubsw multiplies unsigned by signed bytes into int16 pairs.
// 4-bit codes: |pair| <= 2 * 15 * 127 and eight groups sum to <= 30480, exact in int16.
// 5- and 6-bit codes: |pair| <= 2 * 63 * 127, each group widened to int32.
// 8-bit codes: as signed c - 128 with the sign moved onto the input (|pair| <= 2 * 128 * 127),
// then sum (c - 128) x + 128 sum x.
#include "matmul_ymm.h"

namespace rowop {
namespace {

struct DotAvx2 {
  template <int G, int BITS>
  static void prep(__m256i* W) {
    if (BITS == 8) {
      const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
      for (int g = 0; g < G; ++g) {
        W[g] = _mm256_xor_si256(W[g], bias);  // c - 128 as int8
        W[G + g] = _mm256_abs_epi8(W[g]);  // |c - 128| as uint8 (128 stays 0x80 = 128)
      }
    }
  }

  template <int G, int BITS>
  static __m256i dot(const __m256i* W, const int8_t* q, int32_t xsum) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (BITS == 4) {
      __m256i t = _mm256_maddubs_epi16(W[0], bcast4(q));
      for (int g = 1; g < G; ++g) t = _mm256_add_epi16(t, _mm256_maddubs_epi16(W[g], bcast4(q + 4 * g)));
      return _mm256_madd_epi16(t, ones);
    }
    if (BITS == 5 || BITS == 6) {  // |pair| <= 2 * 63 * 127: exact in int16, widened per group
      __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(W[0], bcast4(q)), ones);
      for (int g = 1; g < G; ++g) {
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(W[g], bcast4(q + 4 * g)), ones));
      }
      return s;
    }
    __m256i s = _mm256_set1_epi32(128 * xsum);
    for (int g = 0; g < G; ++g) {
      const __m256i t = _mm256_maddubs_epi16(W[G + g], _mm256_sign_epi8(bcast4(q + 4 * g), W[g]));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(t, ones));
    }
    return s;
  }
};

}  // namespace

const MatmulIsa kMatmulAvx2 = {quantize_rows<quantize_block_scalar>, panels_ymm<DotAvx2>};

}  // namespace rowop
