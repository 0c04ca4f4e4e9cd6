// The op RowSwiGLU (swiglu.h has the arithmetic), its rows split over ONNX Runtime's intra-op pool
// above kSwiGluSplit outputs:
//
//   Y[..., I] = RowSwiGLU(X[..., 2I])   attribute: inter (I)
#include <algorithm>
#include <string>
#include <vector>

#include "ops.h"
#include "swiglu.h"

namespace rowop {
namespace {

constexpr const char* kOpType = "RowSwiGLU";
constexpr int64_t kSwiGluSplit = 1 << 15;  // outputs of a call above which its rows run in parallel

struct SwiGluKernel {
  int64_t inter;
  SwiGluFn fn;
};

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** out) {
  int64_t inter = 0;
  ROWOP_TRY(api->KernelInfoGetAttribute_int64(info, "inter", &inter));
  if (inter <= 0) return error(std::string(kOpType) + ": inter must be positive");
  *out = new SwiGluKernel{inter, static_cast<const PathOp*>(op)->path->swiglu};
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
  j.k->fn(j.x, j.k->inter, r0, r1, j.y);
}

OrtStatus* ORT_API_CALL compute(void* kernel, OrtKernelContext* ctx) {
  const SwiGluKernel& K = *static_cast<const SwiGluKernel*>(kernel);
  Input x;
  ROWOP_TRY(read_input(ctx, 0, &x));
  std::vector<int64_t>& dims = x.dims;
  if (dims.empty() || dims.back() != 2 * K.inter) {
    return error(std::string(kOpType) + ": the input's last dimension must be 2 inter = " +
                 std::to_string(2 * K.inter));
  }
  dims.back() = K.inter;
  float* y = nullptr;
  ROWOP_TRY(write_output(ctx, 0, dims, &y));
  const int64_t rows = x.count / (2 * K.inter);
  if (rows == 0) return nullptr;
  SwiGluJob job{&K, static_cast<const float*>(x.data), y, rows, 1};
  if (rows * K.inter >= kSwiGluSplit) job.tasks = std::min(rows, 2 * workers());
  run_tasks(ctx, swiglu_job, &job, job.tasks);
  return nullptr;
}

OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  return infer_last_dim(ctx, "inter");
}

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return kOpType; }

}  // namespace

PathOp swiglu_op(const Path* path) {
  return make_op(path, op_name, float_type, one_count, create_kernel, compute, infer_shape, destroy_kernel<SwiGluKernel>);
}

}  // namespace rowop
