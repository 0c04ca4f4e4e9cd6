// The ONNX Runtime custom-op library: domain "edgespec.rowop", ops "RowMatMul" (rowop.h has the
// arithmetic) and "RowAttention" (attention.h). Written against ONNX Runtime's C API alone (onnxruntime_c_api.h, versioned and
// backward compatible: a library built with an older header loads in a newer runtime).
//
//   Y[..., N] = RowMatMul(X[..., K] float, W uint8 [panels * blocks * record])
//   attributes: K, N, bits (4|5|6|8), block_size (16|32), zero_point (0 none, 1..255 every block's,
//               -1 one per block and output in the record), mins (0|1), f16 (0|1), sub (0|1:
//               sub-scale codes under fp16 super-block scales; absent in folders exported before it)
//
//   Y[1, T, Hq*D] = RowAttention(Q [1, T, Hq*D], K [1, T, Hkv*D], V [1, T, Hkv*D] (the call's new rows),
//                                past_key, past_value [S, Hkv*D], past_len [1] int64, (tree_mask [T, T] int64))
//   attributes: num_heads, kv_heads, head_dim, scale (float), window (0: none)
//   tree_mask (optional; without it the rows are a chain): 1 where column node c is row node t or one
//   of its ancestors. The op reads the window's rows [lo, past_len) and writes no cache.
//   Optional last inputs past_key_f16, past_value_f16 [S, Hkv*D] float16: a half cache. Where they
//   hold rows, the op reads them instead of past_key / past_value (then empty) and rounds the call's
//   new keys and values to fp16 before use (attention.h), so the engine picks the cache per call.
//
//   Y, K [1, T, Hkv*D], V = RowQkvAttention(QKV [1, T, (Hq+2Hkv)*D], past_key, past_value, past_len,
//                                           positions [1, T] int64, cos, sin [P, D/2], (tree_mask),
//                                           (past_key_f16, past_value_f16))
//   the same after splitting QKV and rotating q and k by the positions (RoPE, halves: y = x cos -
//   rot(x) sin per element, fp32, no FMA): one node for a layer's split, rotations and attention;
//   K (rotated) and V are the rows the engine commits.
//
//   Y[..., K] = RowGather(ids [...] int64, W uint8): rows `ids` of a RowMatMul's weights as floats
//   (its attributes), d (code - z) (+ m) in fp32: an embedding table kept as its tied LM head's blocks.
//
//   Y[..., I] = RowSwiGLU(X[..., 2I])   attribute: inter (I). y = (g / (1 + exp(-g))) * u for the
//   halves g, u of X (the gated MLP's SiLU and product), with the attention's exp: one node for a
//   layer's Split, QuickGelu and Mul, every path the same bits.
//
// The instruction-set path is chosen when a session registers the library: the best this CPU runs,
// or the one EDGESPEC_ROWOP_ISA names (portable, avx2, avxvnni, avx512vnni; refused where the CPU
// lacks it). Threads: ONNX Runtime's intra-op pool (KernelContext_ParallelFor) splits the panels.
#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attention.h"
#include "common.h"
#include "onnxruntime_c_api.h"
#include "rowop.h"

namespace rowop {
namespace {

const OrtApi* g_api = nullptr;
constexpr const char* kDomain = "edgespec.rowop";
constexpr const char* kOpType = "RowMatMul";
constexpr const char* kAttnType = "RowAttention";
constexpr const char* kQkvType = "RowQkvAttention";
constexpr const char* kSwiGluType = "RowSwiGLU";
constexpr const char* kGatherType = "RowGather";
constexpr int64_t kSwiGluSplit = 1 << 15;  // outputs of a call above which its rows run in parallel
constexpr int64_t kAttnSplit = 1 << 16;  // query row x key x D products of a call above which the heads run in parallel
constexpr int64_t kQuantizeSplit = 1 << 15;  // inputs of a call above which the rows are quantized in parallel

// ---- which paths this CPU runs (cpuid, and the OS saving the vector registers: xgetbv) ----
struct Cpu {
  bool avx2 = false, f16c = false, fma = false, avxvnni = false, avx512 = false, avx512vnni = false;
};

Cpu detect_cpu() {
  Cpu c;
  unsigned a, b, cx, d;
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
  const bool osxsave = cx & (1u << 27), avx = cx & (1u << 28);
  c.f16c = cx & (1u << 29);
  c.fma = cx & (1u << 12);
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm_os = avx && (xcr0 & 0x6) == 0x6;
  const bool zmm_os = ymm_os && (xcr0 & 0xE0) == 0xE0;
  if (__get_cpuid_max(0, nullptr) < 7) return c;
  __cpuid_count(7, 0, a, b, cx, d);
  c.avx2 = ymm_os && c.f16c && c.fma && (b & (1u << 5));  // FMA: the attention's 256-bit path
  c.avx512 = zmm_os && (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));  // F, BW, VL
  c.avx512vnni = c.avx512 && (cx & (1u << 11));
  __cpuid_count(7, 1, a, b, cx, d);
  c.avxvnni = c.avx2 && (a & (1u << 4));
  return c;
}

const Cpu& cpu() {
  static const Cpu c = detect_cpu();
  return c;
}

const Isa* const kPaths[] = {&kAvx512Vnni, &kAvxVnni, &kAvx2, &kPortable};  // best first

// The attention each path runs (the AVX-VNNI path has no attention of its own: AVX2's).
const AttnIsa* attention_of(const Isa* isa) {
  if (isa == &kAvx512Vnni) return &kAttnAvx512;
  if (isa == &kAvxVnni || isa == &kAvx2) return &kAttnAvx2;
  return &kAttnPortable;
}

bool runs(const Isa* isa) {
  const Cpu& c = cpu();
  if (isa == &kAvx512Vnni) return c.avx512vnni;
  if (isa == &kAvxVnni) return c.avxvnni;
  if (isa == &kAvx2) return c.avx2;
  return true;
}

// The path a session gets: EDGESPEC_ROWOP_ISA's, or the best this CPU runs. nullptr + why: refused.
const Isa* choose(std::string* why) {
  const char* want = std::getenv("EDGESPEC_ROWOP_ISA");
  if (want == nullptr || *want == 0 || std::strcmp(want, "auto") == 0) {
    for (const Isa* isa : kPaths) {
      if (runs(isa)) return isa;
    }
  }
  for (const Isa* isa : kPaths) {
    if (std::strcmp(isa->name, want) == 0) {
      if (runs(isa)) return isa;
      *why = std::string("EDGESPEC_ROWOP_ISA=") + want + ": this CPU does not run that path";
      return nullptr;
    }
  }
  *why = std::string("EDGESPEC_ROWOP_ISA=") + want + ": not a path (portable, avx2, avxvnni, avx512vnni, auto)";
  return nullptr;
}

// ---- the op ----
struct RowOp : OrtCustomOp {
  const Isa* isa = nullptr;
};

struct Kernel {
  Layout L;
  const Isa* isa;
};

// Per calling thread, grown once: a call's quantized rows (the pool's workers read them). Shared by
// every RowMatMul node (and session) the thread runs, whatever their layouts.
struct Scratch {
  std::vector<int8_t> xq;  // [m * K]: bytes per cell are the block size
  std::vector<float> s, xsumf;  // [m * K / bs] cells
  std::vector<int32_t> xsum, zsum;
};
thread_local Scratch t_scratch;

// The buffers for m rows of layout L, each grown to its own need: the cells and the bytes of a call
// do not grow together (blocks of 16 have twice the cells of blocks of 32 for the same bytes), so
// sizing xq by the cells alone lets a blocks-of-32 call write past what a blocks-of-16 call left.
Rows scratch_rows(Scratch& sc, const Layout& L, int64_t m) {
  const size_t cells = static_cast<size_t>(m * L.blocks()), bytes = cells * static_cast<size_t>(L.bs);
  if (sc.xq.size() < bytes) sc.xq.resize(bytes);
  if (sc.s.size() < cells) {
    sc.s.resize(cells);
    sc.xsumf.resize(cells);
    sc.xsum.resize(cells);
    sc.zsum.resize(cells);
  }
  return Rows{m, L.blocks(), L.bs, sc.xq.data(), sc.s.data(), sc.xsum.data(), sc.xsumf.data(), sc.zsum.data()};
}

OrtStatus* error(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

#define ROWOP_TRY(expr)              \
  do {                               \
    if (OrtStatus* st_ = (expr)) return st_; \
  } while (0)

std::string check_layout(const Layout& L) {
  if (L.bits != 4 && L.bits != 5 && L.bits != 6 && L.bits != 8) return "bits must be 4, 5, 6 or 8";
  if (L.bs != 16 && L.bs != 32) return "block_size must be 16 or 32";
  if (L.bits == 5 && L.bs != 32) return "5-bit codes need block_size 32";
  if (L.k <= 0 || L.n <= 0 || L.k % L.bs) return "K must be a positive multiple of block_size and N positive";
  if (L.zp < -1 || L.zp >= (1 << L.bits)) return "zero_point must be -1 (per block), 0 or a code";
  if (L.sub && (L.k % Layout::kSuper || L.zp < 0)) {
    return "sub-scales need K a multiple of 256 and no per-block zero points";
  }
  return "";
}

// The layout of attributes v: K, N, bits, block_size, zero_point, mins, f16, sub.
Layout layout_of(const int64_t* v) {
  Layout L;
  L.k = v[0];
  L.n = v[1];
  L.bits = static_cast<int>(v[2]);
  L.bs = static_cast<int>(v[3]);
  L.zp = static_cast<int>(v[4]);
  L.mins = v[5] != 0;
  L.f16 = v[6] != 0;
  L.sub = v[7] != 0;
  return L;
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** out) {
  int64_t v[8] = {0, 0, 4, 32, 0, 0, 0, 0};
  const char* names[8] = {"K", "N", "bits", "block_size", "zero_point", "mins", "f16", "sub"};
  for (int i = 0; i < 8; ++i) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, names[i], &v[i])) {
      if (i < 2) return st;  // K and N are required; the rest default (sub 0: folders exported before it)
      api->ReleaseStatus(st);
    }
  }
  const Layout L = layout_of(v);
  const std::string why = check_layout(L);
  if (!why.empty()) return error(std::string(kOpType) + ": " + why);
  *out = new Kernel{L, static_cast<const RowOp*>(op)->isa};
  return nullptr;
}

struct Job {
  const Kernel* k;
  const float* x;
  const uint8_t* w;
  float* y;
  Rows rows;
  int8_t* xq;
  float *s, *xsumf;
  int32_t *xsum, *zsum;
  int64_t m, tasks;
};

void quantize_task(void* p, size_t t) {
  const Job& j = *static_cast<const Job*>(p);
  const int64_t r0 = j.m * static_cast<int64_t>(t) / j.tasks, r1 = j.m * static_cast<int64_t>(t + 1) / j.tasks;
  const Layout& L = j.k->L;
  j.k->isa->quantize(j.x, L.k, L.bs, L.zp, j.m, r0, r1, j.xq, j.s, j.xsum, j.xsumf, j.zsum);
}

void panels_task(void* p, size_t t) {
  const Job& j = *static_cast<const Job*>(p);
  const int64_t panels = j.k->L.panels();
  const int64_t p0 = panels * static_cast<int64_t>(t) / j.tasks, p1 = panels * static_cast<int64_t>(t + 1) / j.tasks;
  j.k->isa->panels(j.k->L, j.w, j.rows, 0, j.m, p0, p1, j.y, j.k->L.n);
}

void parallel(OrtKernelContext* ctx, void (*fn)(void*, size_t), Job* job, int64_t tasks) {
  job->tasks = tasks;
  if (tasks > 1) {
    if (OrtStatus* st = g_api->KernelContext_ParallelFor(ctx, fn, static_cast<size_t>(tasks), 0, job)) {
      g_api->ReleaseStatus(st);  // no pool API in this build: run the tasks here
    } else {
      return;
    }
  }
  for (int64_t t = 0; t < tasks; ++t) fn(job, static_cast<size_t>(t));
}

int64_t workers() {
  static const int64_t n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

OrtStatus* ORT_API_CALL compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel& K = *static_cast<const Kernel*>(kernel);
  const Layout& L = K.L;
  const OrtApi* api = g_api;
  const OrtValue *xv = nullptr, *wv = nullptr;
  ROWOP_TRY(api->KernelContext_GetInput(ctx, 0, &xv));
  ROWOP_TRY(api->KernelContext_GetInput(ctx, 1, &wv));
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ROWOP_TRY(api->GetTensorTypeAndShape(xv, &info));
  size_t nd = 0;
  api->GetDimensionsCount(info, &nd);
  std::vector<int64_t> dims(nd);
  api->GetDimensions(info, dims.data(), nd);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (nd < 1 || dims.back() != L.k) {
    return error(std::string(kOpType) + ": the input's last dimension is " +
                 (nd ? std::to_string(dims.back()) : std::string("missing")) + ", the op's K is " +
                 std::to_string(L.k));
  }
  ROWOP_TRY(api->GetTensorTypeAndShape(wv, &info));
  size_t w_count = 0;
  api->GetTensorShapeElementCount(info, &w_count);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (static_cast<int64_t>(w_count) != L.total_bytes()) {
    return error(std::string(kOpType) + ": the weights hold " + std::to_string(w_count) + " bytes, the layout " +
                 std::to_string(L.total_bytes()) + " (re-export the folder with this edgespec)");
  }
  int64_t m = 1;
  for (size_t i = 0; i + 1 < nd; ++i) m *= dims[i];
  dims.back() = L.n;
  OrtValue* yv = nullptr;
  ROWOP_TRY(api->KernelContext_GetOutput(ctx, 0, dims.data(), nd, &yv));
  void *xp = nullptr, *wp = nullptr, *yp = nullptr;
  ROWOP_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(xv), &xp));
  ROWOP_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(wv), &wp));
  ROWOP_TRY(api->GetTensorMutableData(yv, &yp));
  if (m == 0) return nullptr;

  Scratch& sc = t_scratch;
  const Rows rows = scratch_rows(sc, L, m);
  Job job{&K, static_cast<const float*>(xp), static_cast<const uint8_t*>(wp), static_cast<float*>(yp), rows,
          sc.xq.data(), sc.s.data(), sc.xsumf.data(), sc.xsum.data(), sc.zsum.data(), m, 1};
  parallel(ctx, quantize_task, &job, m * L.k >= kQuantizeSplit ? std::min(m, workers()) : 1);
  parallel(ctx, panels_task, &job, std::min(L.panels(), 4 * workers()));
  return nullptr;
}

// The output's type and shape for ONNX Runtime's planner: input 0's shape, its last dimension n
// (n < 0: kept).
OrtStatus* infer_like_input0(OrtShapeInferContext* ctx, int64_t n, size_t output = 0) {
  const OrtApi* api = g_api;
  OrtTensorTypeAndShapeInfo* in = nullptr;  // owned by the context
  ROWOP_TRY(api->ShapeInferContext_GetInputTypeShape(ctx, 0, &in));
  size_t nd = 0;
  OrtStatus* st = api->GetDimensionsCount(in, &nd);
  std::vector<int64_t> dims(nd);
  std::vector<const char*> names(nd);
  if (st == nullptr) st = api->GetDimensions(in, dims.data(), nd);
  if (st == nullptr) st = api->GetSymbolicDimensions(in, names.data(), nd);
  OrtTensorTypeAndShapeInfo* out = nullptr;
  // A dimension neither fixed nor named would reach ONNX as the value -1, which later shape
  // inference takes as a real -1 (a Shape of it feeding a Reshape is "multiple -1"): then say nothing.
  bool unknown = false;
  const size_t checked = n >= 0 && nd > 0 ? nd - 1 : nd;  // the last dimension is n's where given
  for (size_t i = 0; st == nullptr && i < checked; ++i) unknown |= dims[i] < 0 && (names[i] == nullptr || !*names[i]);
  if (st == nullptr && nd > 0 && !unknown) {
    if (n >= 0) {
      dims.back() = n;
      names.back() = "";
    }
    for (const char*& name : names) name = name ? name : "";  // no name: a fixed or unknown dimension
    st = api->CreateTensorTypeAndShapeInfo(&out);
    if (st == nullptr) st = api->SetTensorElementType(out, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
    if (st == nullptr) st = api->SetDimensions(out, dims.data(), nd);
    if (st == nullptr) st = api->SetSymbolicDimensions(out, names.data(), nd);
    if (st == nullptr) st = api->ShapeInferContext_SetOutputTypeShape(ctx, output, out);
  }
  if (out != nullptr) api->ReleaseTensorTypeAndShapeInfo(out);
  return st;  // `in` belongs to the context
}

// RowMatMul: X's shape, its last dimension N.
OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi* api = g_api;
  const OrtOpAttr* attr = nullptr;
  ROWOP_TRY(api->ShapeInferContext_GetAttribute(ctx, "N", &attr));
  int64_t n = 0;
  size_t got = 0;
  ROWOP_TRY(api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &n, sizeof(n), &got));
  return infer_like_input0(ctx, n);
}

// ---- RowAttention ----
struct AttnOp : OrtCustomOp {
  const AttnIsa* isa = nullptr;
  bool qkv = false;  // RowQkvAttention
};

struct AttnKernel {
  int64_t hq, hkv, d, window;
  float scale;
  const AttnIsa* isa;
  bool qkv;
};

OrtStatus* ORT_API_CALL create_attn_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                           void** out) {
  int64_t v[4] = {0, 0, 0, 0};
  const char* names[4] = {"num_heads", "kv_heads", "head_dim", "window"};
  for (int i = 0; i < 4; ++i) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, names[i], &v[i])) {
      if (i < 3) return st;  // window is optional
      api->ReleaseStatus(st);
    }
  }
  float scale = 0.0f;
  ROWOP_TRY(api->KernelInfoGetAttribute_float(info, "scale", &scale));
  if (v[0] <= 0 || v[1] <= 0 || v[0] % v[1] || v[2] <= 0 || v[3] < 0) {
    return error(std::string(kAttnType) + ": num_heads must be a positive multiple of kv_heads, head_dim positive, "
                 "window >= 0 (num_heads " + std::to_string(v[0]) + ", kv_heads " + std::to_string(v[1]) +
                 ", head_dim " + std::to_string(v[2]) + ", window " + std::to_string(v[3]) + ")");
  }
  const AttnOp* aop = static_cast<const AttnOp*>(op);
  if (aop->qkv && v[2] % 2) return error(std::string(kQkvType) + ": head_dim must be even (RoPE halves)");
  *out = new AttnKernel{v[0], v[1], v[2], v[3], scale, aop->isa, aop->qkv};
  return nullptr;
}

// Row t's new keys in logical order: its ancestors (mask[t][c] != 0, c != t) by depth (their own
// ancestor count; ties by index), then t. No mask: a chain, 0..t.
void order_keys(int64_t T, const int64_t* mask, int32_t* keys, int32_t* n, int32_t* depth) {
  if (mask == nullptr) {
    for (int64_t t = 0; t < T; ++t) {
      n[t] = static_cast<int32_t>(t + 1);
      for (int64_t i = 0; i <= t; ++i) keys[t * T + i] = static_cast<int32_t>(i);
    }
    return;
  }
  for (int64_t c = 0; c < T; ++c) {
    int32_t k = 0;
    for (int64_t j = 0; j < T; ++j) k += j != c && mask[c * T + j] != 0;
    depth[c] = k;
  }
  for (int64_t t = 0; t < T; ++t) {
    int32_t* row = keys + t * T;
    int32_t m = 0;
    for (int64_t c = 0; c < T; ++c) {
      if (c != t && mask[t * T + c] != 0) row[m++] = static_cast<int32_t>(c);
    }
    std::sort(row, row + m, [depth](int32_t a, int32_t b) { return depth[a] != depth[b] ? depth[a] < depth[b] : a < b; });
    row[m] = static_cast<int32_t>(t);
    n[t] = m + 1;
  }
}

// Query rows of one kv head per task: blocks of <= 64 rows, split further (down to 8 rows) until
// there are two tasks per worker.
int64_t attn_rows_per_task(int64_t per_head, int64_t hkv, int64_t workers) {
  int64_t blocks = (per_head + 63) / 64;
  const int64_t want = 2 * workers;
  if (hkv * blocks < want) blocks = std::max<int64_t>(1, std::min((per_head + 7) / 8, (want + hkv - 1) / hkv));
  return (per_head + blocks - 1) / blocks;
}

struct AttnCall {
  std::vector<int32_t> keys, n, depth;
  std::vector<float> q;  // RowQkvAttention: the rotated queries
  std::vector<float> kh, vh;  // a half cache's call: the new keys and values rounded to fp16
};

// The call's new rows rounded to fp16 (a half cache: attention.h), n values of k and v.
void round_rows(const float** k, const float** v, int64_t n, AttnCall& call) {
  if (static_cast<int64_t>(call.kh.size()) < n) {
    call.kh.resize(n);
    call.vh.resize(n);
  }
  for (int64_t i = 0; i < n; ++i) {
    call.kh[i] = attn_round_half((*k)[i]);
    call.vh[i] = attn_round_half((*v)[i]);
  }
  *k = call.kh.data();
  *v = call.vh.data();
}

// y = x rotated by one position's cos/sin halves (RotaryEmbedding's non-interleaved form).
void rotate(const float* x, const float* c, const float* s, int64_t half, float* y) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    y[i] = a * c[i] - b * s[i];
    y[i + half] = b * c[i] + a * s[i];
  }
}
thread_local AttnCall t_call;

struct AttnJob {
  const AttnProblem* pr;
  AttnTaskFn fn;
};

void attn_job(void* p, size_t t) {
  const AttnJob& j = *static_cast<const AttnJob*>(p);
  j.fn(*j.pr, static_cast<int64_t>(t));
}

OrtStatus* tensor_dims(const OrtValue* v, std::vector<int64_t>* dims, int64_t* count) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ROWOP_TRY(g_api->GetTensorTypeAndShape(v, &info));
  size_t nd = 0;
  g_api->GetDimensionsCount(info, &nd);
  dims->assign(nd, 0);
  g_api->GetDimensions(info, dims->data(), nd);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  *count = 1;
  for (int64_t d : *dims) *count *= d;
  return nullptr;
}

OrtStatus* ORT_API_CALL attn_compute(void* kernel, OrtKernelContext* ctx) {
  const AttnKernel& K = *static_cast<const AttnKernel*>(kernel);
  const OrtApi* api = g_api;
  const char* name = K.qkv ? kQkvType : kAttnType;
  // input slots: q/qkv, k, v, past_key, past_value, past_len, tree_mask, positions, cos, sin, the half cache
  enum { kQ, kK, kV, kPk, kPv, kPast, kTree, kPos, kCos, kSin, kPk16, kPv16, kSlots };
  const int map_plain[9] = {kQ, kK, kV, kPk, kPv, kPast, kTree, kPk16, kPv16};
  const int map_qkv[10] = {kQ, kPk, kPv, kPast, kPos, kCos, kSin, kTree, kPk16, kPv16};
  const int* map = K.qkv ? map_qkv : map_plain;
  const size_t n_slots = K.qkv ? 10 : 9, n_required = K.qkv ? 7 : 6;
  size_t n_in = 0;
  ROWOP_TRY(api->KernelContext_GetInputCount(ctx, &n_in));
  const OrtValue* in[kSlots] = {};
  for (size_t i = 0; i < std::min(n_in, n_slots); ++i) ROWOP_TRY(api->KernelContext_GetInput(ctx, i, &in[map[i]]));
  for (size_t i = 0; i < n_required; ++i) {
    if (in[map[i]] == nullptr) return error(std::string(name) + ": input " + std::to_string(i) + " is missing");
  }
  const int64_t kv_w = K.hkv * K.d, q_w = K.hq * K.d, in_w = K.qkv ? q_w + 2 * kv_w : q_w, half = K.d / 2;
  std::vector<int64_t> qd, dims, cos_dims;
  int64_t count[kSlots] = {};
  ROWOP_TRY(tensor_dims(in[kQ], &qd, &count[kQ]));
  for (int i = 1; i < kSlots; ++i) {
    if (in[i] != nullptr) ROWOP_TRY(tensor_dims(in[i], i == kCos ? &cos_dims : &dims, &count[i]));
  }
  if (qd.empty() || qd.back() != in_w) {
    return error(std::string(name) + ": the input's last dimension must be " +
                 (K.qkv ? "(num_heads + 2 kv_heads) * head_dim = " : "num_heads * head_dim = ") +
                 std::to_string(in_w));
  }
  const bool f16 = in[kPk16] != nullptr && count[kPk16] > 0;  // the half cache holds the window
  const int kc_slot = f16 ? kPk16 : kPk, vc_slot = f16 ? kPv16 : kPv;
  const int64_t T = count[kQ] / in_w, S = count[kc_slot] / kv_w;
  bool ok = count[kc_slot] % kv_w == 0 && in[vc_slot] != nullptr && count[vc_slot] == count[kc_slot] &&
            count[kPast] == 1 &&
            (in[kTree] == nullptr || count[kTree] == T * T);
  if (K.qkv) {
    ok = ok && count[kPos] == T && cos_dims.size() == 2 && cos_dims[1] == half && count[kSin] == count[kCos];
  } else {
    ok = ok && count[kK] == T * kv_w && count[kV] == T * kv_w;
  }
  if (!ok) {
    return error(std::string(name) + ": shapes: " +
                 (K.qkv ? "qkv [1, T, (Hq+2Hkv)*D], positions [1, T], cos and sin [P, D/2], "
                        : "q [1, T, Hq*D], k and v [1, T, Hkv*D], ") +
                 "past_key and past_value (or their f16 pair) [S, Hkv*D], past_len [1], tree_mask [T, T] (T " +
                 std::to_string(T) +
                 ", Hkv*D " + std::to_string(kv_w) + ")");
  }
  void* data[kSlots] = {};
  for (int i = 0; i < kSlots; ++i) {
    if (in[i] != nullptr) ROWOP_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(in[i]), &data[i]));
  }
  const int64_t past = *static_cast<const int64_t*>(data[kPast]);
  if (past < 0 || past > S) {
    return error(std::string(name) + ": past_len " + std::to_string(past) + " outside the window of " +
                 std::to_string(S) + " slots");
  }
  std::vector<int64_t> od(qd);
  od.back() = q_w;
  OrtValue* yv = nullptr;
  ROWOP_TRY(api->KernelContext_GetOutput(ctx, 0, od.data(), od.size(), &yv));
  void* yp = nullptr;
  ROWOP_TRY(api->GetTensorMutableData(yv, &yp));
  AttnCall& call = t_call;
  const float *q = static_cast<const float*>(data[kQ]), *k = static_cast<const float*>(data[kK]);
  const float* v = static_cast<const float*>(data[kV]);
  if (K.qkv) {  // split, rotate q and k, copy v
    od.back() = kv_w;
    OrtValue *kv_out[2] = {nullptr, nullptr};
    void* kv_p[2] = {nullptr, nullptr};
    for (int i = 0; i < 2; ++i) {
      ROWOP_TRY(api->KernelContext_GetOutput(ctx, 1 + i, od.data(), od.size(), &kv_out[i]));
      ROWOP_TRY(api->GetTensorMutableData(kv_out[i], &kv_p[i]));
    }
    if (static_cast<int64_t>(call.q.size()) < T * q_w) call.q.resize(T * q_w);
    const int64_t n_pos = cos_dims[0];
    const int64_t* pos = static_cast<const int64_t*>(data[kPos]);
    const float *cs = static_cast<const float*>(data[kCos]), *sn = static_cast<const float*>(data[kSin]);
    float *qr = call.q.data(), *kr = static_cast<float*>(kv_p[0]), *vr = static_cast<float*>(kv_p[1]);
    for (int64_t t = 0; t < T; ++t) {
      if (pos[t] < 0 || pos[t] >= n_pos) {
        return error(std::string(name) + ": position " + std::to_string(pos[t]) + " outside the rotary tables' " +
                     std::to_string(n_pos));
      }
      const float* x = q + t * in_w;
      const float *c = cs + pos[t] * half, *sv = sn + pos[t] * half;
      for (int64_t h = 0; h < K.hq; ++h) rotate(x + h * K.d, c, sv, half, qr + t * q_w + h * K.d);
      for (int64_t h = 0; h < K.hkv; ++h) rotate(x + q_w + h * K.d, c, sv, half, kr + t * kv_w + h * K.d);
      std::memcpy(vr + t * kv_w, x + q_w + kv_w, kv_w * sizeof(float));
    }
    q = qr;
    k = kr;
    v = vr;
  }
  if (T == 0) return nullptr;
  if (f16) round_rows(&k, &v, T * kv_w, call);
  if (static_cast<int64_t>(call.n.size()) < T) {
    call.keys.resize(T * T);
    call.n.resize(T);
    call.depth.resize(T);
  } else if (static_cast<int64_t>(call.keys.size()) < T * T) {
    call.keys.resize(T * T);
  }
  order_keys(T, static_cast<const int64_t*>(data[kTree]), call.keys.data(), call.n.data(), call.depth.data());
  AttnProblem pr;
  pr.t = T;
  pr.hq = K.hq;
  pr.hkv = K.hkv;
  pr.d = K.d;
  pr.past = past;
  pr.window = K.window;
  pr.scale = K.scale;
  pr.q = q;
  pr.k = k;
  pr.v = v;
  if (f16) {
    pr.kc16 = static_cast<const uint16_t*>(data[kPk16]);
    pr.vc16 = static_cast<const uint16_t*>(data[kPv16]);
  } else {
    pr.kc = static_cast<const float*>(data[kPk]);
    pr.vc = static_cast<const float*>(data[kPv]);
  }
  pr.keys = call.keys.data();
  pr.n_keys = call.n.data();
  pr.out = static_cast<float*>(yp);
  const bool split = K.hq * T * (past + T) * K.d >= kAttnSplit;
  pr.rows_per_task = attn_rows_per_task(pr.rows_per_head(), K.hkv, split ? workers() : 1);
  AttnJob job{&pr, K.isa->task};
  const int64_t tasks = pr.tasks();
  if (split && tasks > 1) {
    OrtStatus* st = api->KernelContext_ParallelFor(ctx, attn_job, static_cast<size_t>(tasks), 0, &job);
    if (st == nullptr) return nullptr;
    api->ReleaseStatus(st);  // no pool API in this build: run the tasks here
  }
  for (int64_t t = 0; t < tasks; ++t) attn_job(&job, static_cast<size_t>(t));
  return nullptr;
}

OrtStatus* ORT_API_CALL infer_attn_shape(const OrtCustomOp* op, OrtShapeInferContext* ctx) {
  if (!static_cast<const AttnOp*>(op)->qkv) return infer_like_input0(ctx, -1, 0);
  const OrtApi* api = g_api;
  int64_t v[3] = {0, 0, 0};
  const char* names[3] = {"num_heads", "kv_heads", "head_dim"};
  for (int i = 0; i < 3; ++i) {
    const OrtOpAttr* attr = nullptr;
    size_t got = 0;
    ROWOP_TRY(api->ShapeInferContext_GetAttribute(ctx, names[i], &attr));
    ROWOP_TRY(api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &v[i], sizeof(v[i]), &got));
  }
  ROWOP_TRY(infer_like_input0(ctx, v[0] * v[2], 0));
  ROWOP_TRY(infer_like_input0(ctx, v[1] * v[2], 1));
  return infer_like_input0(ctx, v[1] * v[2], 2);
}

// ---- RowSwiGLU ----
struct SwiGluOp : OrtCustomOp {
  const AttnIsa* isa = nullptr;
};

struct SwiGluKernel {
  int64_t inter;
  const AttnIsa* isa;
};

OrtStatus* ORT_API_CALL create_swiglu_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                             void** out) {
  int64_t inter = 0;
  ROWOP_TRY(api->KernelInfoGetAttribute_int64(info, "inter", &inter));
  if (inter <= 0) return error(std::string(kSwiGluType) + ": inter must be positive");
  *out = new SwiGluKernel{inter, static_cast<const SwiGluOp*>(op)->isa};
  return nullptr;
}

struct SwiGluJob {
  const SwiGluKernel* k;
  const float* x;
  float* y;
  int64_t rows, tasks;
};

void swiglu_job(void* p, size_t t) {
  const SwiGluJob& j = *static_cast<const SwiGluJob*>(p);
  const int64_t r0 = j.rows * static_cast<int64_t>(t) / j.tasks, r1 = j.rows * static_cast<int64_t>(t + 1) / j.tasks;
  j.k->isa->swiglu(j.x, j.k->inter, r0, r1, j.y);
}

OrtStatus* ORT_API_CALL swiglu_compute(void* kernel, OrtKernelContext* ctx) {
  const SwiGluKernel& K = *static_cast<const SwiGluKernel*>(kernel);
  const OrtApi* api = g_api;
  const OrtValue* xv = nullptr;
  ROWOP_TRY(api->KernelContext_GetInput(ctx, 0, &xv));
  std::vector<int64_t> dims;
  int64_t count = 0;
  ROWOP_TRY(tensor_dims(xv, &dims, &count));
  if (dims.empty() || dims.back() != 2 * K.inter) {
    return error(std::string(kSwiGluType) + ": the input's last dimension must be 2 inter = " +
                 std::to_string(2 * K.inter));
  }
  dims.back() = K.inter;
  OrtValue* yv = nullptr;
  ROWOP_TRY(api->KernelContext_GetOutput(ctx, 0, dims.data(), dims.size(), &yv));
  void *xp = nullptr, *yp = nullptr;
  ROWOP_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(xv), &xp));
  ROWOP_TRY(api->GetTensorMutableData(yv, &yp));
  const int64_t rows = count / (2 * K.inter);
  if (rows == 0) return nullptr;
  SwiGluJob job{&K, static_cast<const float*>(xp), static_cast<float*>(yp), rows, 1};
  if (rows * K.inter >= kSwiGluSplit) job.tasks = std::min(rows, 2 * workers());
  if (job.tasks > 1) {
    OrtStatus* st = api->KernelContext_ParallelFor(ctx, swiglu_job, static_cast<size_t>(job.tasks), 0, &job);
    if (st == nullptr) return nullptr;
    api->ReleaseStatus(st);
  }
  for (int64_t t = 0; t < job.tasks; ++t) swiglu_job(&job, static_cast<size_t>(t));
  return nullptr;
}

OrtStatus* ORT_API_CALL infer_swiglu_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi* api = g_api;
  const OrtOpAttr* attr = nullptr;
  ROWOP_TRY(api->ShapeInferContext_GetAttribute(ctx, "inter", &attr));
  int64_t inter = 0;
  size_t got = 0;
  ROWOP_TRY(api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &inter, sizeof(inter), &got));
  return infer_like_input0(ctx, inter);
}

// ---- RowGather: rows of a packed linear (its Layout, RowMatMul's attributes) as floats ----
OrtStatus* ORT_API_CALL gather_compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel& K = *static_cast<const Kernel*>(kernel);
  const Layout& L = K.L;
  const OrtApi* api = g_api;
  const OrtValue *iv = nullptr, *wv = nullptr;
  ROWOP_TRY(api->KernelContext_GetInput(ctx, 0, &iv));
  ROWOP_TRY(api->KernelContext_GetInput(ctx, 1, &wv));
  std::vector<int64_t> dims, wdims;
  int64_t count = 0, w_count = 0;
  ROWOP_TRY(tensor_dims(iv, &dims, &count));
  ROWOP_TRY(tensor_dims(wv, &wdims, &w_count));
  if (w_count != L.total_bytes()) {
    return error(std::string(kGatherType) + ": the weights hold " + std::to_string(w_count) + " bytes, the layout " +
                 std::to_string(L.total_bytes()) + " (re-export the folder with this edgespec)");
  }
  dims.push_back(L.k);
  OrtValue* yv = nullptr;
  ROWOP_TRY(api->KernelContext_GetOutput(ctx, 0, dims.data(), dims.size(), &yv));
  void *ip = nullptr, *wp = nullptr, *yp = nullptr;
  ROWOP_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(iv), &ip));
  ROWOP_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(wv), &wp));
  ROWOP_TRY(api->GetTensorMutableData(yv, &yp));
  const int64_t* ids = static_cast<const int64_t*>(ip);
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= L.n) {
      return error(std::string(kGatherType) + ": token id " + std::to_string(ids[i]) + " is outside the table's " +
                   std::to_string(L.n) + " rows");
    }
    gather_row(L, static_cast<const uint8_t*>(wp), ids[i], static_cast<float*>(yp) + i * L.k);
  }
  return nullptr;
}

// RowGather: the ids' shape and K.
OrtStatus* ORT_API_CALL infer_gather_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi* api = g_api;
  const OrtOpAttr* attr = nullptr;
  ROWOP_TRY(api->ShapeInferContext_GetAttribute(ctx, "K", &attr));
  int64_t k = 0;
  size_t got = 0;
  ROWOP_TRY(api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &k, sizeof(k), &got));
  OrtTensorTypeAndShapeInfo* in = nullptr;  // owned by the context
  ROWOP_TRY(api->ShapeInferContext_GetInputTypeShape(ctx, 0, &in));
  size_t nd = 0;
  ROWOP_TRY(api->GetDimensionsCount(in, &nd));
  std::vector<int64_t> dims(nd);
  std::vector<const char*> names(nd);
  ROWOP_TRY(api->GetDimensions(in, dims.data(), nd));
  ROWOP_TRY(api->GetSymbolicDimensions(in, names.data(), nd));
  for (size_t i = 0; i < nd; ++i) {
    if (dims[i] < 0 && (names[i] == nullptr || !*names[i])) return nullptr;  // unknown: say nothing
    names[i] = names[i] ? names[i] : "";
  }
  dims.push_back(k);
  names.push_back("");
  OrtTensorTypeAndShapeInfo* out = nullptr;
  OrtStatus* st = api->CreateTensorTypeAndShapeInfo(&out);
  if (st == nullptr) st = api->SetTensorElementType(out, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  if (st == nullptr) st = api->SetDimensions(out, dims.data(), dims.size());
  if (st == nullptr) st = api->SetSymbolicDimensions(out, names.data(), names.size());
  if (st == nullptr) st = api->ShapeInferContext_SetOutputTypeShape(ctx, 0, out);
  if (out != nullptr) api->ReleaseTensorTypeAndShapeInfo(out);
  return st;
}

const char* ORT_API_CALL gather_name(const OrtCustomOp*) { return kGatherType; }
ONNXTensorElementDataType ORT_API_CALL gather_input_type(const OrtCustomOp*, size_t i) {
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
}

void ORT_API_CALL destroy_kernel(void* kernel) { delete static_cast<Kernel*>(kernel); }
void ORT_API_CALL destroy_swiglu_kernel(void* kernel) { delete static_cast<SwiGluKernel*>(kernel); }
const char* ORT_API_CALL swiglu_name(const OrtCustomOp*) { return kSwiGluType; }
ONNXTensorElementDataType ORT_API_CALL float_type(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
void ORT_API_CALL destroy_attn_kernel(void* kernel) { delete static_cast<AttnKernel*>(kernel); }
bool is_qkv(const OrtCustomOp* op) { return static_cast<const AttnOp*>(op)->qkv; }
const char* ORT_API_CALL attn_name(const OrtCustomOp* op) { return is_qkv(op) ? kQkvType : kAttnType; }
size_t ORT_API_CALL attn_input_count(const OrtCustomOp* op) { return is_qkv(op) ? 10 : 9; }
ONNXTensorElementDataType ORT_API_CALL attn_input_type(const OrtCustomOp* op, size_t i) {
  if (i + 2 >= attn_input_count(op)) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;  // the half cache
  const bool f = is_qkv(op) ? (i < 3 || i == 5 || i == 6) : i < 5;  // qkv: positions, past_len, tree int64
  return f ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
}
size_t ORT_API_CALL attn_output_count(const OrtCustomOp* op) { return is_qkv(op) ? 3 : 1; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL attn_input_required(const OrtCustomOp* op, size_t i) {
  return i + 3 >= attn_input_count(op) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // tree_mask, the half cache
}
const char* ORT_API_CALL op_name(const OrtCustomOp*) { return kOpType; }
const char* ORT_API_CALL op_provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t i) {
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
}
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return 2; }
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 1; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL mem_type(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL zero(const OrtCustomOp*) { return 0; }
int ORT_API_CALL one(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return 2147483647; }

// What every op of the library sets alike: the API version, the CPU provider, float outputs, no
// variadic arguments, any opset; the rest zero.
void base_op(OrtCustomOp& op) {
  std::memset(&op, 0, sizeof(OrtCustomOp));
  op.version = ORT_API_VERSION;
  op.GetExecutionProviderType = op_provider;
  op.GetOutputType = output_type;
  op.GetOutputCharacteristic = required;
  op.GetInputMemoryType = mem_type;
  op.GetVariadicInputMinArity = one;
  op.GetVariadicInputHomogeneity = zero;
  op.GetVariadicOutputMinArity = one;
  op.GetVariadicOutputHomogeneity = zero;
  op.GetStartVersion = one;
  op.GetEndVersion = end_version;
}

RowOp make_op(const Isa* isa) {
  RowOp op;
  base_op(op);
  op.GetName = op_name;
  op.GetInputType = input_type;
  op.GetInputTypeCount = input_count;
  op.GetOutputTypeCount = output_count;
  op.KernelDestroy = destroy_kernel;
  op.GetInputCharacteristic = required;
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.InferOutputShapeFn = infer_shape;
  op.isa = isa;
  return op;
}

RowOp make_gather_op(const Isa* isa) {
  RowOp op = make_op(isa);
  op.GetName = gather_name;
  op.GetInputType = gather_input_type;
  op.KernelComputeV2 = gather_compute;
  op.InferOutputShapeFn = infer_gather_shape;
  return op;
}

AttnOp make_attn_op(const Isa* isa, bool qkv) {
  AttnOp op;
  base_op(op);
  op.GetName = attn_name;
  op.GetInputType = attn_input_type;
  op.GetInputTypeCount = attn_input_count;
  op.GetOutputTypeCount = attn_output_count;
  op.KernelDestroy = destroy_attn_kernel;
  op.GetInputCharacteristic = attn_input_required;
  op.CreateKernelV2 = create_attn_kernel;
  op.KernelComputeV2 = attn_compute;
  op.InferOutputShapeFn = infer_attn_shape;
  op.isa = attention_of(isa);
  op.qkv = qkv;
  return op;
}

SwiGluOp make_swiglu_op(const Isa* isa) {
  SwiGluOp op;
  base_op(op);
  op.GetName = swiglu_name;
  op.GetInputType = float_type;
  op.GetInputTypeCount = output_count;  // 1
  op.GetOutputTypeCount = output_count;
  op.KernelDestroy = destroy_swiglu_kernel;
  op.GetInputCharacteristic = required;
  op.CreateKernelV2 = create_swiglu_kernel;
  op.KernelComputeV2 = swiglu_compute;
  op.InferOutputShapeFn = infer_swiglu_shape;
  op.isa = attention_of(isa);
  return op;
}

// The ops and one domain per path, made on first use and kept for the process (ONNX Runtime
// requires them to outlive every session that registered them).
RowOp g_ops[4], g_gather_ops[4];
AttnOp g_attn_ops[4], g_qkv_ops[4];
SwiGluOp g_swiglu_ops[4];
OrtCustomOpDomain* g_domains[4] = {};
std::mutex g_mutex;

}  // namespace
}  // namespace rowop

extern "C" {

// ONNX Runtime's entry point (SessionOptions.register_custom_ops_library).
OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  using namespace rowop;
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (api == nullptr) return nullptr;  // cannot happen: the runtime is never older than the pip floor
  g_api = api;
  std::string why;
  const Isa* isa = choose(&why);
  if (isa == nullptr) return api->CreateStatus(ORT_INVALID_ARGUMENT, why.c_str());
  const int slot = static_cast<int>(std::find(std::begin(kPaths), std::end(kPaths), isa) - std::begin(kPaths));
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_domains[slot] == nullptr) {
      g_ops[slot] = make_op(isa);
      g_gather_ops[slot] = make_gather_op(isa);
      g_attn_ops[slot] = make_attn_op(isa, false);
      g_qkv_ops[slot] = make_attn_op(isa, true);
      g_swiglu_ops[slot] = make_swiglu_op(isa);
      OrtCustomOpDomain* domain = nullptr;
      if (OrtStatus* st = api->CreateCustomOpDomain(kDomain, &domain)) return st;
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_ops[slot])) return st;
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_gather_ops[slot])) return st;
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_attn_ops[slot])) return st;
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_qkv_ops[slot])) return st;
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_swiglu_ops[slot])) return st;
      g_domains[slot] = domain;
    }
  }
  return api->AddCustomOpDomain(options, g_domains[slot]);
}

// For edgespec (ctypes): the path a session would get now ("" and *why set where refused), whether
// this CPU runs a named path, and the op's arithmetic on one thread with a named path (tests, benches).
const char* edgespec_rowop_path(const char** why) {
  static thread_local std::string msg;
  msg.clear();
  const rowop::Isa* isa = rowop::choose(&msg);
  *why = msg.c_str();
  return isa ? isa->name : "";
}

int edgespec_rowop_runs(const char* name) {
  for (const rowop::Isa* isa : rowop::kPaths) {
    if (std::strcmp(isa->name, name) == 0) return rowop::runs(isa) ? 1 : 0;
  }
  return 0;
}

// attrs: K, N, bits, block_size, zero_point, mins, f16, sub. Returns 0, or -1 (unknown or unsupported
// path, bad layout).
int edgespec_rowop_matmul(const char* name, const int64_t* attrs, const float* x, int64_t m, const uint8_t* w,
                          float* y) {
  using namespace rowop;
  const Isa* isa = nullptr;
  for (const Isa* p : kPaths) {
    if (std::strcmp(p->name, name) == 0 && runs(p)) isa = p;
  }
  const Layout L = layout_of(attrs);
  if (isa == nullptr || !check_layout(L).empty()) return -1;
  if (m == 0) return 0;
  Scratch& sc = t_scratch;  // the op's own buffers, grown as the op grows them (the tests' layouts in turn)
  const Rows rows = scratch_rows(sc, L, m);
  isa->quantize(x, L.k, L.bs, L.zp, m, 0, m, sc.xq.data(), sc.s.data(), sc.xsum.data(), sc.xsumf.data(),
                sc.zsum.data());
  isa->panels(L, w, rows, 0, m, 0, L.panels(), y, L.n);
  return 0;
}

// Rows `ids` (m of them) of a packed linear as floats [m, K] (RowGather's arithmetic, no ONNX Runtime).
// Returns 0, or -1 (bad layout or id).
int edgespec_rowop_gather(const int64_t* attrs, const int64_t* ids, int64_t m, const uint8_t* w, float* y) {
  using namespace rowop;
  const Layout L = layout_of(attrs);
  if (!check_layout(L).empty()) return -1;
  for (int64_t i = 0; i < m; ++i) {
    if (ids[i] < 0 || ids[i] >= L.n) return -1;
    gather_row(L, w, ids[i], y + i * L.k);
  }
  return 0;
}

// dims: T, Hq, Hkv, D, S, past_len, window; tree_mask [T, T] or nullptr (a chain). The op on one
// thread with a named path, in tasks of rows_per_task query rows (0: the op's choice for one worker).
// Returns 0, or -1 (unknown or unsupported path, bad shape).
// kc / vc: float, or with half != 0 fp16 (the new rows k / v are then rounded to fp16 first, as the op does).
int edgespec_rowop_attention(const char* name, const int64_t* dims, float scale, const float* q, const float* k,
                             const float* v, const void* kc, const void* vc, const int64_t* tree_mask,
                             int64_t rows_per_task, float* out, int half) {
  using namespace rowop;
  const Isa* isa = nullptr;
  for (const Isa* p : kPaths) {
    if (std::strcmp(p->name, name) == 0 && runs(p)) isa = p;
  }
  AttnProblem pr;
  pr.t = dims[0];
  pr.hq = dims[1];
  pr.hkv = dims[2];
  pr.d = dims[3];
  pr.past = dims[5];
  pr.window = dims[6];
  if (isa == nullptr || pr.t < 0 || pr.hq <= 0 || pr.hkv <= 0 || pr.hq % pr.hkv || pr.d <= 0 || pr.past < 0 ||
      pr.past > dims[4] || pr.window < 0) {
    return -1;
  }
  if (pr.t == 0) return 0;
  std::vector<int32_t> keys(pr.t * pr.t), n(pr.t), depth(pr.t);
  order_keys(pr.t, tree_mask, keys.data(), n.data(), depth.data());
  pr.scale = scale;
  pr.q = q;
  pr.k = k;
  pr.v = v;
  std::vector<float> kh, vh;
  if (half) {
    kh.resize(pr.t * pr.hkv * pr.d);
    vh.resize(kh.size());
    for (size_t i = 0; i < kh.size(); ++i) {
      kh[i] = attn_round_half(k[i]);
      vh[i] = attn_round_half(v[i]);
    }
    pr.k = kh.data();
    pr.v = vh.data();
    pr.kc16 = static_cast<const uint16_t*>(kc);
    pr.vc16 = static_cast<const uint16_t*>(vc);
  } else {
    pr.kc = static_cast<const float*>(kc);
    pr.vc = static_cast<const float*>(vc);
  }
  pr.keys = keys.data();
  pr.n_keys = n.data();
  pr.out = out;
  pr.rows_per_task = rows_per_task > 0 ? rows_per_task : attn_rows_per_task(pr.rows_per_head(), pr.hkv, 1);
  const AttnIsa* a = attention_of(isa);
  for (int64_t t = 0; t < pr.tasks(); ++t) a->task(pr, t);
  return 0;
}

// x [n] float -> out [n] fp16 bits, as the op rounds a half cache's new rows (tests: numpy's astype).
void edgespec_rowop_round_half(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = rowop::attn_float_to_half(x[i]);
}

}  // extern "C"
