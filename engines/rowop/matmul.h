// edgespec's row kernel, the op RowMatMul: y = x W for block-quantized W (4-, 5-, 6- or 8-bit codes, a scale per
// block, an optional zero point, an optional block minimum), x quantized to int8 per row and per block.
//
// The arithmetic, the same in every instruction-set path and in the NumPy reference
// (edgespec.engines.rowop.reference), for row r, output n, block b of bs inputs:
//   a     = max |x[r, b*bs : (b+1)*bs]|                      (exact)
//   inv   = a > 0 ? 127 / a : 0,   s = a / 127               (fp32, one rounding each)
//   xq[k] = clamp(rint(x[k] * inv), -127, 127)               (int8, round half to even)
//   dot   = sum_k xq[k] * code[k, n] - z[b, n] * sum_k xq[k] (int32: exact)
//   f     = float(dot) * d[b, n]                             (fp32)
//   f     = f + m[b, n] * float(sum_k xq[k])                 (only with block minimums)
//   acc  += f * s                                            (fp32, blocks in order)
// With sub-scales (Layout::sub: GGUF's K-quants kept as their codes) a block's d and m are
//   d[b, n] = D[n] * float(sc[b, n]),  m[b, n] = -(Dmin[n] * float(mn[b, n]))  (fp32, exact: an
// fp16 times an integer of at most 8 bits), D and Dmin the fp16 super-block scales of its 256 inputs:
// the same floats as the fp32 d and m the export computed from them, so the same result bits.
// Every factor depends on row r alone and the sums are exact integers, so a row's bits do not
// depend on how many rows share the call, nor on the path that ran it. Built with
// -ffp-contract=off: a fused multiply-add would round once where the reference rounds twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rowop {

constexpr int kPanel = 16;  // outputs per panel: one 512-bit register of int32 or fp32 lanes
constexpr int kRowChunk = 64;  // rows one pass over a panel's weights serves (accumulators stay in L1)

// One linear's weight layout (the op's attributes). Weights are panels of 16 outputs; a panel's
// blocks are contiguous records: codes, scales, [mins], [zero points]. Codes of a block: 4 bits:
// chunk c of 64 bytes holds group c (4 inputs x 16 outputs, byte 4n + j) in its low nibbles and
// group c + G/2 in its high ones (G = bs / 4 groups); 5 and 6 bits: those low 4 bits, then their
// high bits: 6 bits: chunk c, bits 2i..2i+1 of byte 4n + j are bits 4..5 of group c + i G/4; 5 bits
// (blocks of 32): bit i of byte 4n + j is bit 4 of group i; 8 bits: chunk g is group g.
// sub: before the records of each super-block of 256 inputs a header D fp16[16], [Dmin fp16[16]];
// a record then holds codes, sc int8[16] (d = D sc), [mn int8[16] (m = -(Dmin mn))] (no zero points
// per block).
struct Layout {
  int64_t k = 0, n = 0;  // inputs, outputs
  int bits = 4;  // 4, 5, 6 or 8
  int bs = 32;  // inputs per block: 16 or 32
  int zp = 0;  // 0: none; 1..255: one zero point for every block; -1: one per block and output (u8 in the record)
  bool mins = false;  // a block minimum per block and output (scale-typed, in the record)
  bool f16 = false;  // scales and mins stored as fp16 (exactly: the checkpoint's own values), else fp32
  bool sub = false;  // sub-scale codes under fp16 super-block scales (K-quants), see above

  static constexpr int kSuper = 256;  // inputs per super-block (sub)
  int64_t blocks() const { return k / bs; }
  int64_t panels() const { return (n + kPanel - 1) / kPanel; }
  int sub_blocks() const { return kSuper / bs; }  // blocks per super-block (sub)
  int code_bytes() const { return bs * kPanel * bits / 8; }
  int scale_bytes() const { return kPanel * (f16 ? 2 : 4); }
  int head_bytes() const { return sub ? kPanel * 2 * (mins ? 2 : 1) : 0; }
  int record_bytes() const {
    if (sub) return code_bytes() + kPanel * (mins ? 2 : 1);
    return code_bytes() + scale_bytes() * (mins ? 2 : 1) + (zp < 0 ? kPanel : 0);
  }
  int64_t panel_bytes() const {
    return sub ? (k / kSuper) * (head_bytes() + sub_blocks() * static_cast<int64_t>(record_bytes()))
               : blocks() * record_bytes();
  }
  int64_t total_bytes() const { return panels() * panel_bytes(); }
  // Block b's record in panel p (sub: after the headers of its super-block and those before).
  const uint8_t* record(const uint8_t* w, int64_t p, int64_t b) const {
    const int64_t head = sub ? (b / sub_blocks() + 1) * head_bytes() : 0;
    return w + p * panel_bytes() + head + b * record_bytes();
  }
};

// A call's rows, quantized once (block-major: a block's rows are contiguous, so a pass over one
// weight block reads them in order).
struct Rows {
  int64_t m = 0;  // rows
  int64_t nb = 0;  // blocks per row
  int bs = 32;
  const int8_t* xq = nullptr;  // [nb][m][bs]
  const float* s = nullptr;  // [nb][m] row-block scales
  const int32_t* xsum = nullptr;  // [nb][m] sums of the quantized values
  const float* xsumf = nullptr;  // [nb][m] the same as fp32 (exact: |sum| <= 127 * 32)
  const int32_t* zsum = nullptr;  // [nb][m] uniform zero point x sum (0 without one)
};

// Quantize rows [r0, r1) of x [m, k] into the buffers Rows points at (cast away const there).
using QuantizeFn = void (*)(const float* x, int64_t k, int bs, int zp, int64_t m, int64_t r0, int64_t r1,
                            int8_t* xq, float* s, int32_t* xsum, float* xsumf, int32_t* zsum);
// y[r, n] for rows [r0, r1) and panels [p0, p1); ldy the output row stride.
using PanelsFn = void (*)(const Layout& L, const uint8_t* w, const Rows& x, int64_t r0, int64_t r1, int64_t p0,
                          int64_t p1, float* y, int64_t ldy);

// One instruction-set variant of the op (matmul_<isa>.cc); cpu_features.cc picks the one a session runs.
struct MatmulIsa {
  QuantizeFn quantize;
  PanelsFn panels;
};

// Each variant in its own translation unit, compiled for its instruction set.
extern const MatmulIsa kMatmulPortable;
extern const MatmulIsa kMatmulAvx2;
extern const MatmulIsa kMatmulAvxVnni;
extern const MatmulIsa kMatmulAvx512Vnni;

// The layout of the op's attributes v: K, N, bits, block_size, zero_point, mins, f16, sub (matmul.cc).
Layout layout_of(const int64_t* v);
// What is wrong with a layout ("" where nothing is).
std::string check_layout(const Layout& L);

// Shared by the paths: the scalar quantization of one row-block (the definition, and the tail).
static inline void quantize_block_scalar(const float* x, int bs, int8_t* q, float* s, int32_t* sum) {
  float a = 0.0f;
  for (int i = 0; i < bs; ++i) {
    float v = x[i] < 0 ? -x[i] : x[i];
    a = v > a ? v : a;
  }
  float inv = a > 0.0f ? 127.0f / a : 0.0f;
  *s = a / 127.0f;
  int32_t t = 0;
  for (int i = 0; i < bs; ++i) {
    float v = __builtin_rintf(x[i] * inv);
    v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    q[i] = static_cast<int8_t>(v);
    t += q[i];
  }
  *sum = t;
}

}  // namespace rowop
