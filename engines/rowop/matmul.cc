// The op RowMatMul (matmul.h has the arithmetic and the layout), on ONNX Runtime's intra-op pool:
//
//   Y[..., N] = RowMatMul(X[..., K] float, W uint8 [panels * blocks * record])
//   attributes: K, N, bits (4|5|6|8), block_size (16|32), zero_point (0 none, 1..255 every block's,
//               -1 one per block and output in the record), mins (0|1), f16 (0|1), sub (0|1:
//               sub-scale codes under fp16 super-block scales; absent in folders exported before it)
//
// The rows are quantized once (in parallel above kQuantizeSplit inputs), then the pool splits the
// panels; the path's variant (matmul_<isa>.cc) does both.
#include <algorithm>
#include <string>
#include <vector>

#include "ops.h"

namespace rowop {
namespace {

constexpr const char* kOpType = "RowMatMul";
constexpr int64_t kQuantizeSplit = 1 << 15;  // inputs of a call above which the rows are quantized in parallel

struct Kernel {
  Layout L;
  const MatmulIsa* isa;
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

// m rows of x into the thread's scratch rows (rows [r0, r1) of them).
struct Job {
  const Kernel* k;
  const float* x;
  const uint8_t* w;
  float* y;
  Rows rows;
  int64_t m, tasks;
};

void quantize_task(void* p, size_t t) {
  const Job& j = *static_cast<const Job*>(p);
  const int64_t r0 = j.m * static_cast<int64_t>(t) / j.tasks, r1 = j.m * static_cast<int64_t>(t + 1) / j.tasks;
  const Layout& L = j.k->L;
  const Rows& x = j.rows;
  j.k->isa->quantize(j.x, L.k, L.bs, L.zp, j.m, r0, r1, const_cast<int8_t*>(x.xq), const_cast<float*>(x.s),
                     const_cast<int32_t*>(x.xsum), const_cast<float*>(x.xsumf), const_cast<int32_t*>(x.zsum));
}

void panels_task(void* p, size_t t) {
  const Job& j = *static_cast<const Job*>(p);
  const int64_t panels = j.k->L.panels();
  const int64_t p0 = panels * static_cast<int64_t>(t) / j.tasks, p1 = panels * static_cast<int64_t>(t + 1) / j.tasks;
  j.k->isa->panels(j.k->L, j.w, j.rows, 0, j.m, p0, p1, j.y, j.k->L.n);
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** out) {
  Layout L;
  ROWOP_TRY(read_layout(api, info, kOpType, &L));
  *out = new Kernel{L, static_cast<const PathOp*>(op)->path->matmul};
  return nullptr;
}

OrtStatus* ORT_API_CALL compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel& K = *static_cast<const Kernel*>(kernel);
  const Layout& L = K.L;
  Input x, w;
  ROWOP_TRY(read_input(ctx, 0, &x));
  std::vector<int64_t>& dims = x.dims;
  if (dims.empty() || dims.back() != L.k) {
    return error(std::string(kOpType) + ": the input's last dimension is " +
                 (dims.empty() ? std::string("missing") : std::to_string(dims.back())) + ", the op's K is " +
                 std::to_string(L.k));
  }
  ROWOP_TRY(read_input(ctx, 1, &w));
  ROWOP_TRY(check_weights(kOpType, L, w.count));
  const int64_t m = x.count / L.k;
  dims.back() = L.n;
  float* y = nullptr;
  ROWOP_TRY(write_output(ctx, 0, dims, &y));
  if (m == 0) return nullptr;

  Job job{&K, static_cast<const float*>(x.data), static_cast<const uint8_t*>(w.data), y, scratch_rows(t_scratch, L, m),
          m, 1};
  job.tasks = m * L.k >= kQuantizeSplit ? std::min(m, workers()) : 1;
  run_tasks(ctx, quantize_task, &job, job.tasks);
  job.tasks = std::min(L.panels(), 4 * workers());
  run_tasks(ctx, panels_task, &job, job.tasks);
  return nullptr;
}

// X's shape, its last dimension N.
OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) { return infer_last_dim(ctx, "N"); }

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return kOpType; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t i) {
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
}
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return 2; }

}  // namespace

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

OrtStatus* read_layout(const OrtApi* api, const OrtKernelInfo* info, const char* op, Layout* L) {
  int64_t v[8] = {0, 0, 4, 32, 0, 0, 0, 0};
  const char* names[8] = {"K", "N", "bits", "block_size", "zero_point", "mins", "f16", "sub"};
  for (int i = 0; i < 8; ++i) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, names[i], &v[i])) {
      if (i < 2) return st;  // K and N are required; the rest default (sub 0: folders exported before it)
      api->ReleaseStatus(st);
    }
  }
  *L = layout_of(v);
  const std::string why = check_layout(*L);
  return why.empty() ? nullptr : error(std::string(op) + ": " + why);
}

OrtStatus* check_weights(const char* op, const Layout& L, int64_t bytes) {
  if (bytes == L.total_bytes()) return nullptr;
  return error(std::string(op) + ": the weights hold " + std::to_string(bytes) + " bytes, the layout " +
               std::to_string(L.total_bytes()) + " (re-export the folder with this edgespec)");
}

PathOp matmul_op(const Path* path) {
  return make_op(path, op_name, input_type, input_count, create_kernel, compute, infer_shape, destroy_kernel<Kernel>);
}

}  // namespace rowop

extern "C" {

// For edgespec (ctypes): the op's arithmetic on one thread with a named path (tests, benches).
// attrs: K, N, bits, block_size, zero_point, mins, f16, sub. Returns 0, or -1 (unknown or unsupported
// path, bad layout).
int edgespec_rowop_matmul(const char* name, const int64_t* attrs, const float* x, int64_t m, const uint8_t* w,
                          float* y) {
  using namespace rowop;
  const Path* path = path_named(name);
  const Layout L = layout_of(attrs);
  if (path == nullptr || !check_layout(L).empty()) return -1;
  if (m == 0) return 0;
  Scratch& sc = t_scratch;  // the op's own buffers, grown as the op grows them (the tests' layouts in turn)
  const Rows rows = scratch_rows(sc, L, m);
  path->matmul->quantize(x, L.k, L.bs, L.zp, m, 0, m, sc.xq.data(), sc.s.data(), sc.xsum.data(), sc.xsumf.data(),
                         sc.zsum.data());
  path->matmul->panels(L, w, rows, 0, m, 0, L.panels(), y, L.n);
  return 0;
}

}  // extern "C"
