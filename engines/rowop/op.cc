// The ONNX Runtime custom-op library: domain "edgespec.rowop", op "RowMatMul" (rowop.h has the
// arithmetic). Written against ONNX Runtime's C API alone (onnxruntime_c_api.h, versioned and
// backward compatible: a library built with an older header loads in a newer runtime).
//
//   Y[..., N] = RowMatMul(X[..., K] float, W uint8 [panels * blocks * record])
//   attributes: K, N, bits (4|8), block_size (16|32), zero_point (0 none, 1..255 every block's,
//               -1 one per block and output in the record), mins (0|1), f16 (0|1)
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

#include "onnxruntime_c_api.h"
#include "rowop.h"

namespace rowop {
namespace {

const OrtApi* g_api = nullptr;
constexpr const char* kDomain = "edgespec.rowop";
constexpr const char* kOpType = "RowMatMul";
constexpr int64_t kQuantizeSplit = 1 << 15;  // inputs of a call above which the rows are quantized in parallel

// ---- which paths this CPU runs (cpuid, and the OS saving the vector registers: xgetbv) ----
struct Cpu {
  bool avx2 = false, f16c = false, avxvnni = false, avx512 = false, avx512vnni = false;
};

Cpu detect_cpu() {
  Cpu c;
  unsigned a, b, cx, d;
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
  const bool osxsave = cx & (1u << 27), avx = cx & (1u << 28);
  c.f16c = cx & (1u << 29);
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
  c.avx2 = ymm_os && c.f16c && (b & (1u << 5));
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

// Per calling thread, grown once: a call's quantized rows (the pool's workers read them).
struct Scratch {
  std::vector<int8_t> xq;
  std::vector<float> s, xsumf;
  std::vector<int32_t> xsum, zsum;
};
thread_local Scratch t_scratch;

OrtStatus* error(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

#define ROWOP_TRY(expr)              \
  do {                               \
    if (OrtStatus* st_ = (expr)) return st_; \
  } while (0)

std::string check_layout(const Layout& L) {
  if (L.bits != 4 && L.bits != 8) return "bits must be 4 or 8";
  if (L.bs != 16 && L.bs != 32) return "block_size must be 16 or 32";
  if (L.k <= 0 || L.n <= 0 || L.k % L.bs) return "K must be a positive multiple of block_size and N positive";
  if (L.zp < -1 || L.zp > (L.bits == 4 ? 15 : 255)) return "zero_point must be -1 (per block), 0 or a code";
  return "";
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** out) {
  Layout L;
  int64_t v[7] = {0, 0, 4, 32, 0, 0, 0};
  const char* names[7] = {"K", "N", "bits", "block_size", "zero_point", "mins", "f16"};
  for (int i = 0; i < 7; ++i) {
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, names[i], &v[i])) {
      if (i < 2) return st;  // K and N are required
      api->ReleaseStatus(st);
    }
  }
  L.k = v[0];
  L.n = v[1];
  L.bits = static_cast<int>(v[2]);
  L.bs = static_cast<int>(v[3]);
  L.zp = static_cast<int>(v[4]);
  L.mins = v[5] != 0;
  L.f16 = v[6] != 0;
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
  const size_t cells = static_cast<size_t>(m * L.blocks());
  if (sc.s.size() < cells) {
    sc.xq.resize(cells * L.bs);
    sc.s.resize(cells);
    sc.xsumf.resize(cells);
    sc.xsum.resize(cells);
    sc.zsum.resize(cells);
  }
  Job job{&K, static_cast<const float*>(xp), static_cast<const uint8_t*>(wp), static_cast<float*>(yp), Rows{},
          sc.xq.data(), sc.s.data(), sc.xsumf.data(), sc.xsum.data(), sc.zsum.data(), m, 1};
  job.rows = Rows{m, L.blocks(), L.bs, sc.xq.data(), sc.s.data(), sc.xsum.data(), sc.xsumf.data(), sc.zsum.data()};
  parallel(ctx, quantize_task, &job, m * L.k >= kQuantizeSplit ? std::min(m, workers()) : 1);
  parallel(ctx, panels_task, &job, std::min(L.panels(), 4 * workers()));
  return nullptr;
}

// The output's type and shape for ONNX Runtime's planner: X's shape, its last dimension N.
OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi* api = g_api;
  const OrtOpAttr* attr = nullptr;
  ROWOP_TRY(api->ShapeInferContext_GetAttribute(ctx, "N", &attr));
  int64_t n = 0;
  size_t got = 0;
  ROWOP_TRY(api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &n, sizeof(n), &got));
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
  for (size_t i = 0; st == nullptr && i + 1 < nd; ++i) unknown |= dims[i] < 0 && (names[i] == nullptr || !*names[i]);
  if (st == nullptr && nd > 0 && !unknown) {
    dims.back() = n;
    names.back() = "";
    for (const char*& name : names) name = name ? name : "";  // no name: a fixed or unknown dimension
    st = api->CreateTensorTypeAndShapeInfo(&out);
    if (st == nullptr) st = api->SetTensorElementType(out, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
    if (st == nullptr) st = api->SetDimensions(out, dims.data(), nd);
    if (st == nullptr) st = api->SetSymbolicDimensions(out, names.data(), nd);
    if (st == nullptr) st = api->ShapeInferContext_SetOutputTypeShape(ctx, 0, out);
  }
  if (out != nullptr) api->ReleaseTensorTypeAndShapeInfo(out);
  return st;  // `in` belongs to the context
}

void ORT_API_CALL destroy_kernel(void* kernel) { delete static_cast<Kernel*>(kernel); }
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

RowOp make_op(const Isa* isa) {
  RowOp op;
  std::memset(static_cast<OrtCustomOp*>(&op), 0, sizeof(OrtCustomOp));
  op.version = ORT_API_VERSION;
  op.GetName = op_name;
  op.GetExecutionProviderType = op_provider;
  op.GetInputType = input_type;
  op.GetInputTypeCount = input_count;
  op.GetOutputType = output_type;
  op.GetOutputTypeCount = output_count;
  op.KernelDestroy = destroy_kernel;
  op.GetInputCharacteristic = required;
  op.GetOutputCharacteristic = required;
  op.GetInputMemoryType = mem_type;
  op.GetVariadicInputMinArity = one;
  op.GetVariadicInputHomogeneity = zero;
  op.GetVariadicOutputMinArity = one;
  op.GetVariadicOutputHomogeneity = zero;
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.InferOutputShapeFn = infer_shape;
  op.GetStartVersion = one;
  op.GetEndVersion = end_version;
  op.isa = isa;
  return op;
}

// One op and one domain per path, made on first use and kept for the process (ONNX Runtime
// requires both to outlive every session that registered them).
RowOp g_ops[4];
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
      OrtCustomOpDomain* domain = nullptr;
      if (OrtStatus* st = api->CreateCustomOpDomain(kDomain, &domain)) return st;
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_ops[slot])) return st;
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

// attrs: K, N, bits, block_size, zero_point, mins, f16. Returns 0, or -1 (unknown or unsupported
// path, bad layout).
int edgespec_rowop_matmul(const char* name, const int64_t* attrs, const float* x, int64_t m, const uint8_t* w,
                          float* y) {
  using namespace rowop;
  const Isa* isa = nullptr;
  for (const Isa* p : kPaths) {
    if (std::strcmp(p->name, name) == 0 && runs(p)) isa = p;
  }
  Layout L;
  L.k = attrs[0];
  L.n = attrs[1];
  L.bits = static_cast<int>(attrs[2]);
  L.bs = static_cast<int>(attrs[3]);
  L.zp = static_cast<int>(attrs[4]);
  L.mins = attrs[5] != 0;
  L.f16 = attrs[6] != 0;
  if (isa == nullptr || !check_layout(L).empty()) return -1;
  const size_t cells = static_cast<size_t>(m * L.blocks());
  std::vector<int8_t> xq(cells * L.bs);
  std::vector<float> s(cells), xsumf(cells);
  std::vector<int32_t> xsum(cells), zsum(cells);
  isa->quantize(x, L.k, L.bs, L.zp, m, 0, m, xq.data(), s.data(), xsum.data(), xsumf.data(), zsum.data());
  const Rows rows{m, L.blocks(), L.bs, xq.data(), s.data(), xsum.data(), xsumf.data(), zsum.data()};
  isa->panels(L, w, rows, 0, m, 0, L.panels(), y, L.n);
  return 0;
}

}  // extern "C"
