// The op RowGather: rows of a packed linear (its Layout: RowMatMul's attributes) as floats, an
// embedding table kept as its tied LM head's blocks.
//
//   Y[..., K] = RowGather(ids [...] int64, W uint8)
//   w[k] = float(code - z) * d (+ m), fp32, one rounding per operation, for k in [0, K).
#include <string>
#include <vector>

#include "matmul_common.h"
#include "ops.h"

namespace rowop {
namespace {

constexpr const char* kOpType = "RowGather";

struct Kernel {
  Layout L;
};

// Output row n of a packed linear as floats [K].
void gather_row(const Layout& L, const uint8_t* w, int64_t n, float* out) {
  const int64_t nb = L.blocks(), p = n / kPanel;
  const int lane = static_cast<int>(n % kPanel), groups = L.bs / 4;
  float d[kPanel], mn[kPanel];
  int32_t z[kPanel];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rp = L.record(w, p, b);
    block_factors(L, rp, block_header(L, w, p, b), d, mn, z);
    float* o = out + b * L.bs;
    for (int g = 0; g < groups; ++g) {
      for (int j = 0; j < 4; ++j) {
        float v = static_cast<float>(code_at(L, rp, g, lane, j) - z[lane]) * d[lane];
        if (L.mins) v = v + mn[lane];
        o[4 * g + j] = v;
      }
    }
  }
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) {
  Layout L;
  ROWOP_TRY(read_layout(api, info, kOpType, &L));
  *out = new Kernel{L};
  return nullptr;
}

OrtStatus* ORT_API_CALL compute(void* kernel, OrtKernelContext* ctx) {
  const Layout& L = static_cast<const Kernel*>(kernel)->L;
  Input ids, w;
  ROWOP_TRY(read_input(ctx, 0, &ids));
  ROWOP_TRY(read_input(ctx, 1, &w));
  ROWOP_TRY(check_weights(kOpType, L, w.count));
  std::vector<int64_t> dims(ids.dims);
  dims.push_back(L.k);
  float* y = nullptr;
  ROWOP_TRY(write_output(ctx, 0, dims, &y));
  const int64_t* id = static_cast<const int64_t*>(ids.data);
  for (int64_t i = 0; i < ids.count; ++i) {
    if (id[i] < 0 || id[i] >= L.n) {
      return error(std::string(kOpType) + ": token id " + std::to_string(id[i]) + " is outside the table's " +
                   std::to_string(L.n) + " rows");
    }
    gather_row(L, static_cast<const uint8_t*>(w.data), id[i], y + i * L.k);
  }
  return nullptr;
}

// The ids' shape and K.
OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi* api = g_api;
  int64_t k = 0;
  ROWOP_TRY(infer_attribute(ctx, "K", &k));
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

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return kOpType; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t i) {
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
}
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return 2; }

}  // namespace

PathOp gather_op(const Path* path) {
  return make_op(path, op_name, input_type, input_count, create_kernel, compute, infer_shape, destroy_kernel<Kernel>);
}

}  // namespace rowop

extern "C" {

// For edgespec (ctypes): rows `ids` (m of them) of a packed linear as floats [m, K] (RowGather's
// arithmetic, no ONNX Runtime). Returns 0, or -1 (bad layout or id).
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

}  // extern "C"

