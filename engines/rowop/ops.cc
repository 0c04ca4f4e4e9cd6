// The plumbing every op of the library shares (ops.h).
#include "ops.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace rowop {

const OrtApi* g_api = nullptr;

OrtStatus* error(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

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

OrtStatus* read_input(OrtKernelContext* ctx, size_t i, Input* in) {
  const OrtValue* v = nullptr;
  ROWOP_TRY(g_api->KernelContext_GetInput(ctx, i, &v));
  ROWOP_TRY(tensor_dims(v, &in->dims, &in->count));
  return g_api->GetTensorMutableData(const_cast<OrtValue*>(v), &in->data);
}

OrtStatus* write_output(OrtKernelContext* ctx, size_t i, const std::vector<int64_t>& dims, float** data) {
  OrtValue* v = nullptr;
  void* p = nullptr;
  ROWOP_TRY(g_api->KernelContext_GetOutput(ctx, i, dims.data(), dims.size(), &v));
  ROWOP_TRY(g_api->GetTensorMutableData(v, &p));
  *data = static_cast<float*>(p);
  return nullptr;
}

OrtStatus* infer_like_input0(OrtShapeInferContext* ctx, int64_t n, size_t output) {
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

OrtStatus* infer_attribute(OrtShapeInferContext* ctx, const char* name, int64_t* v) {
  const OrtOpAttr* attr = nullptr;
  size_t got = 0;
  ROWOP_TRY(g_api->ShapeInferContext_GetAttribute(ctx, name, &attr));
  return g_api->ReadOpAttr(attr, ORT_OP_ATTR_INT, v, sizeof(*v), &got);
}

OrtStatus* infer_last_dim(OrtShapeInferContext* ctx, const char* name) {
  int64_t n = 0;
  ROWOP_TRY(infer_attribute(ctx, name, &n));
  return infer_like_input0(ctx, n);
}

int64_t workers() {
  static const int64_t n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

void run_tasks(OrtKernelContext* ctx, void (*fn)(void*, size_t), void* job, int64_t tasks, bool pool) {
  if (pool && tasks > 1) {
    if (OrtStatus* st = g_api->KernelContext_ParallelFor(ctx, fn, static_cast<size_t>(tasks), 0, job)) {
      g_api->ReleaseStatus(st);  // no pool API in this build: run the tasks here
    } else {
      return;
    }
  }
  for (int64_t t = 0; t < tasks; ++t) fn(job, static_cast<size_t>(t));
}

namespace {

const char* ORT_API_CALL op_provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
OrtMemType ORT_API_CALL mem_type(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL zero(const OrtCustomOp*) { return 0; }
int ORT_API_CALL one(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return 2147483647; }

}  // namespace

ONNXTensorElementDataType ORT_API_CALL float_type(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}
size_t ORT_API_CALL one_count(const OrtCustomOp*) { return 1; }

PathOp make_op(const Path* path, decltype(OrtCustomOp::GetName) name, decltype(OrtCustomOp::GetInputType) input_type,
               decltype(OrtCustomOp::GetInputTypeCount) input_count, decltype(OrtCustomOp::CreateKernelV2) create,
               decltype(OrtCustomOp::KernelComputeV2) compute, decltype(OrtCustomOp::InferOutputShapeFn) infer,
               decltype(OrtCustomOp::KernelDestroy) destroy) {
  PathOp op;
  std::memset(static_cast<OrtCustomOp*>(&op), 0, sizeof(OrtCustomOp));
  op.version = ORT_API_VERSION;
  op.GetExecutionProviderType = op_provider;
  op.GetOutputType = float_type;
  op.GetOutputTypeCount = one_count;
  op.GetOutputCharacteristic = required;
  op.GetInputCharacteristic = required;
  op.GetInputMemoryType = mem_type;
  op.GetVariadicInputMinArity = one;
  op.GetVariadicInputHomogeneity = zero;
  op.GetVariadicOutputMinArity = one;
  op.GetVariadicOutputHomogeneity = zero;
  op.GetStartVersion = one;
  op.GetEndVersion = end_version;
  op.GetName = name;
  op.GetInputType = input_type;
  op.GetInputTypeCount = input_count;
  op.CreateKernelV2 = create;
  op.KernelComputeV2 = compute;
  op.InferOutputShapeFn = infer;
  op.KernelDestroy = destroy;
  op.path = path;
  return op;
}

}  // namespace rowop
