// The ONNX Runtime custom-op library's entry point: domain "edgespec.rowop" with the ops RowMatMul
// (matmul.cc), RowGather (gather.cc), RowAttention and RowQkvAttention (attention.cc) and RowSwiGLU
// (swiglu.cc), every one on the path cpu_features.cc chooses when a session registers the library.
// Threads: ONNX Runtime's intra-op pool (KernelContext_ParallelFor) splits each op's work.
#include <algorithm>
#include <iterator>
#include <mutex>
#include <string>

#include "cpu_features.h"
#include "ops.h"

namespace rowop {
namespace {

// The ops of one path, in the order they join its domain.
PathOp (*const kMakers[])(const Path*) = {matmul_op, gather_op, attention_op, qkv_attention_op, swiglu_op};
constexpr int kOps = static_cast<int>(std::size(kMakers));

// The ops and one domain per path, made on first use and kept for the process (ONNX Runtime
// requires them to outlive every session that registered them).
PathOp g_ops[kPathCount][kOps];
OrtCustomOpDomain* g_domains[kPathCount] = {};
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
  const Path* path = choose(&why);
  if (path == nullptr) return api->CreateStatus(ORT_INVALID_ARGUMENT, why.c_str());
  const int slot = static_cast<int>(path - kPaths);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_domains[slot] == nullptr) {
      OrtCustomOpDomain* domain = nullptr;
      if (OrtStatus* st = api->CreateCustomOpDomain(kDomain, &domain)) return st;
      for (int i = 0; i < kOps; ++i) {
        g_ops[slot][i] = kMakers[i](path);
        if (OrtStatus* st = api->CustomOpDomain_Add(domain, &g_ops[slot][i])) return st;
      }
      g_domains[slot] = domain;
    }
  }
  return api->AddCustomOpDomain(options, g_domains[slot]);
}

}  // extern "C"
