// What the library's ONNX Runtime ops share (ops.cc): the API, errors, tensor shapes, the output
// shape for the planner, the intra-op pool, the descriptor fields every op sets alike; and each op's
// descriptor maker (registration.cc puts them in the domain). Written against ONNX Runtime's C API
// alone (onnxruntime_c_api.h, versioned and backward compatible: a library built with an older header
// loads in a newer runtime).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "matmul.h"
#include "onnxruntime_c_api.h"

namespace rowop {

constexpr const char* kDomain = "edgespec.rowop";

extern const OrtApi* g_api;  // set by RegisterCustomOps before any op runs

#define ROWOP_TRY(expr)                      \
  do {                                       \
    if (OrtStatus* st_ = (expr)) return st_; \
  } while (0)

OrtStatus* error(const std::string& msg);
// A tensor's dimensions and element count.
OrtStatus* tensor_dims(const OrtValue* v, std::vector<int64_t>* dims, int64_t* count);
// A call's input i: its dimensions, element count and data.
struct Input {
  std::vector<int64_t> dims;
  int64_t count = 0;
  void* data = nullptr;
};
OrtStatus* read_input(OrtKernelContext* ctx, size_t i, Input* in);
// The call's float output i of dimensions dims, its data.
OrtStatus* write_output(OrtKernelContext* ctx, size_t i, const std::vector<int64_t>& dims, float** data);
// Output `output`'s type and shape for ONNX Runtime's planner: input 0's shape, its last dimension n
// (n < 0: kept).
OrtStatus* infer_like_input0(OrtShapeInferContext* ctx, int64_t n, size_t output = 0);
// An int attribute at shape inference.
OrtStatus* infer_attribute(OrtShapeInferContext* ctx, const char* name, int64_t* v);
// Output 0: input 0's shape, its last dimension the int attribute `name`.
OrtStatus* infer_last_dim(OrtShapeInferContext* ctx, const char* name);
// The workers of ONNX Runtime's intra-op pool (the machine's threads).
int64_t workers();
// fn(job, t) for t in [0, tasks): on the intra-op pool where `pool` and tasks > 1 (run here where
// this build has no pool API), else in order on this thread.
void run_tasks(OrtKernelContext* ctx, void (*fn)(void*, size_t), void* job, int64_t tasks, bool pool = true);

// A RowMatMul / RowGather layout from the node's attributes, checked (op: the name errors give).
OrtStatus* read_layout(const OrtApi* api, const OrtKernelInfo* info, const char* op, Layout* L);
// The weights input holds the layout's bytes.
OrtStatus* check_weights(const char* op, const Layout& L, int64_t bytes);

// An op of the library for one path (ONNX Runtime requires it to outlive every session using it).
struct PathOp : OrtCustomOp {
  const Path* path = nullptr;
};

// An op's descriptor: its own callbacks, and the fields every op sets alike (the API version, the CPU
// provider, one float output, required inputs, no variadic arguments, any opset; the rest zero).
PathOp make_op(const Path* path, decltype(OrtCustomOp::GetName) name, decltype(OrtCustomOp::GetInputType) input_type,
               decltype(OrtCustomOp::GetInputTypeCount) input_count, decltype(OrtCustomOp::CreateKernelV2) create,
               decltype(OrtCustomOp::KernelComputeV2) compute, decltype(OrtCustomOp::InferOutputShapeFn) infer,
               decltype(OrtCustomOp::KernelDestroy) destroy);
// KernelDestroy of a kernel of type K.
template <class K>
void ORT_API_CALL destroy_kernel(void* kernel) {
  delete static_cast<K*>(kernel);
}
ONNXTensorElementDataType ORT_API_CALL float_type(const OrtCustomOp*, size_t);
OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp*, size_t);
size_t ORT_API_CALL one_count(const OrtCustomOp*);

// Each op's descriptor (its own file).
PathOp matmul_op(const Path* path);  // matmul.cc
PathOp gather_op(const Path* path);  // gather.cc
PathOp attention_op(const Path* path);  // attention.cc
PathOp qkv_attention_op(const Path* path);  // attention.cc
PathOp swiglu_op(const Path* path);  // swiglu.cc

}  // namespace rowop
