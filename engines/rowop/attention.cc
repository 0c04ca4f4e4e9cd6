// The ops RowAttention and RowQkvAttention (attention.h has the arithmetic), on ONNX Runtime's
// intra-op pool (the heads' row blocks split above kAttnSplit products):
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
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "attention.h"
#include "half.h"
#include "ops.h"

namespace rowop {
namespace {

constexpr const char* kAttnType = "RowAttention";
constexpr const char* kQkvType = "RowQkvAttention";
constexpr int64_t kAttnSplit = 1 << 16;  // query row x key x D products of a call above which the heads run in parallel

struct AttnKernel {
  int64_t hq, hkv, d, window;
  float scale;
  AttnTaskFn task;
};

OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, bool qkv, void** out) {
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
  if (qkv && v[2] % 2) return error(std::string(kQkvType) + ": head_dim must be even (RoPE halves)");
  *out = new AttnKernel{v[0], v[1], v[2], v[3], scale, static_cast<const PathOp*>(op)->path->attention};
  return nullptr;
}

OrtStatus* ORT_API_CALL create_attn_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                           void** out) {
  return create_kernel(op, api, info, false, out);
}

OrtStatus* ORT_API_CALL create_qkv_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                          void** out) {
  return create_kernel(op, api, info, true, out);
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

// A call's buffers (per calling thread, grown once).
struct AttnCall {
  std::vector<int32_t> keys, n, depth;
  std::vector<float> q;  // RowQkvAttention: the rotated queries
  std::vector<float> kh, vh;  // a half cache's call: the new keys and values rounded to fp16
};
thread_local AttnCall t_call;

// The problem of T new rows q, k, v (head shape in pr) over the cache kc, vc (half: fp16, and then k
// and v rounded to fp16 first), their new keys ordered by the tree mask (nullptr: a chain).
void set_rows(AttnProblem& pr, const float* q, const float* k, const float* v, const void* kc, const void* vc,
              bool half, const int64_t* mask, AttnCall& call) {
  const int64_t T = pr.t, n = T * pr.hkv * pr.d;
  pr.q = q;
  pr.k = k;
  pr.v = v;
  if (half) {
    if (static_cast<int64_t>(call.kh.size()) < n) {
      call.kh.resize(n);
      call.vh.resize(n);
    }
    for (int64_t i = 0; i < n; ++i) {
      call.kh[i] = round_half(k[i]);
      call.vh[i] = round_half(v[i]);
    }
    pr.k = call.kh.data();
    pr.v = call.vh.data();
    pr.kc16 = static_cast<const uint16_t*>(kc);
    pr.vc16 = static_cast<const uint16_t*>(vc);
  } else {
    pr.kc = static_cast<const float*>(kc);
    pr.vc = static_cast<const float*>(vc);
  }
  if (static_cast<int64_t>(call.n.size()) < T) {
    call.keys.resize(T * T);
    call.n.resize(T);
    call.depth.resize(T);
  } else if (static_cast<int64_t>(call.keys.size()) < T * T) {
    call.keys.resize(T * T);
  }
  order_keys(T, mask, call.keys.data(), call.n.data(), call.depth.data());
  pr.keys = call.keys.data();
  pr.n_keys = call.n.data();
}

// y = x rotated by one position's cos/sin halves (RotaryEmbedding's non-interleaved form).
void rotate(const float* x, const float* c, const float* s, int64_t half, float* y) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    y[i] = a * c[i] - b * s[i];
    y[i + half] = b * c[i] + a * s[i];
  }
}

struct AttnJob {
  const AttnProblem* pr;
  AttnTaskFn fn;
};

void attn_job(void* p, size_t t) {
  const AttnJob& j = *static_cast<const AttnJob*>(p);
  j.fn(*j.pr, static_cast<int64_t>(t));
}

// A call's inputs by slot: q (RowQkvAttention: qkv), k, v, past_key, past_value, past_len, tree_mask,
// positions, cos, sin, the half cache.
enum Slot { kQ, kK, kV, kPk, kPv, kPast, kTree, kPos, kCos, kSin, kPk16, kPv16, kSlots };
constexpr int kAttnSlots[9] = {kQ, kK, kV, kPk, kPv, kPast, kTree, kPk16, kPv16};  // RowAttention's inputs
constexpr int kQkvSlots[10] = {kQ, kPk, kPv, kPast, kPos, kCos, kSin, kTree, kPk16, kPv16};  // RowQkvAttention's

struct Inputs {
  const OrtValue* in[kSlots] = {};
  int64_t count[kSlots] = {};
  void* data[kSlots] = {};
  std::vector<int64_t> qd, cos_dims;  // input 0's and cos' dimensions
  bool f16 = false;  // the half cache holds the window
  int64_t t = 0, s = 0, past = 0;  // new rows, cache slots, past_len
};

// The inputs in the op's order `slots` (the first `required` of them required), their shapes, the
// first one's last dimension `width` (`what` names it in the error).
OrtStatus* read_inputs(OrtKernelContext* ctx, const char* name, const int* slots, size_t n_slots, size_t required,
                       int64_t width, const char* what, int64_t kv_w, Inputs* x) {
  size_t n_in = 0;
  ROWOP_TRY(g_api->KernelContext_GetInputCount(ctx, &n_in));
  for (size_t i = 0; i < std::min(n_in, n_slots); ++i) ROWOP_TRY(g_api->KernelContext_GetInput(ctx, i, &x->in[slots[i]]));
  for (size_t i = 0; i < required; ++i) {
    if (x->in[slots[i]] == nullptr) return error(std::string(name) + ": input " + std::to_string(i) + " is missing");
  }
  std::vector<int64_t> dims;
  ROWOP_TRY(tensor_dims(x->in[kQ], &x->qd, &x->count[kQ]));
  for (int i = 1; i < kSlots; ++i) {
    if (x->in[i] != nullptr) ROWOP_TRY(tensor_dims(x->in[i], i == kCos ? &x->cos_dims : &dims, &x->count[i]));
  }
  if (x->qd.empty() || x->qd.back() != width) {
    return error(std::string(name) + ": the input's last dimension must be " + what + std::to_string(width));
  }
  x->f16 = x->in[kPk16] != nullptr && x->count[kPk16] > 0;
  x->t = x->count[kQ] / width;
  x->s = x->count[x->f16 ? kPk16 : kPk] / kv_w;
  return nullptr;
}

// The cache pair, past_len and tree_mask have their shapes.
bool cache_shapes_ok(const Inputs& x, int64_t kv_w) {
  const int kc = x.f16 ? kPk16 : kPk, vc = x.f16 ? kPv16 : kPv;
  return x.count[kc] % kv_w == 0 && x.in[vc] != nullptr && x.count[vc] == x.count[kc] && x.count[kPast] == 1 &&
         (x.in[kTree] == nullptr || x.count[kTree] == x.t * x.t);
}

// The inputs' data, past_len read and checked against the window.
OrtStatus* read_data(const char* name, Inputs* x) {
  for (int i = 0; i < kSlots; ++i) {
    if (x->in[i] != nullptr) ROWOP_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(x->in[i]), &x->data[i]));
  }
  x->past = *static_cast<const int64_t*>(x->data[kPast]);
  if (x->past < 0 || x->past > x->s) {
    return error(std::string(name) + ": past_len " + std::to_string(x->past) + " outside the window of " +
                 std::to_string(x->s) + " slots");
  }
  return nullptr;
}

std::string shapes_error(const char* name, const char* own, const Inputs& x, int64_t kv_w) {
  return std::string(name) + ": shapes: " + own +
         "past_key and past_value (or their f16 pair) [S, Hkv*D], past_len [1], tree_mask [T, T] (T " +
         std::to_string(x.t) + ", Hkv*D " + std::to_string(kv_w) + ")";
}

// The attention of the call's new rows q, k, v (float) into y.
OrtStatus* attend(OrtKernelContext* ctx, const AttnKernel& K, const Inputs& x, const float* q, const float* k,
                  const float* v, float* y) {
  if (x.t == 0) return nullptr;
  AttnProblem pr;
  pr.t = x.t;
  pr.hq = K.hq;
  pr.hkv = K.hkv;
  pr.d = K.d;
  pr.past = x.past;
  pr.window = K.window;
  pr.scale = K.scale;
  const int kc = x.f16 ? kPk16 : kPk, vc = x.f16 ? kPv16 : kPv;
  set_rows(pr, q, k, v, x.data[kc], x.data[vc], x.f16, static_cast<const int64_t*>(x.data[kTree]), t_call);
  pr.out = y;
  const bool split = K.hq * x.t * (x.past + x.t) * K.d >= kAttnSplit;
  pr.rows_per_task = attn_rows_per_task(pr.rows_per_head(), K.hkv, split ? workers() : 1);
  AttnJob job{&pr, K.task};
  run_tasks(ctx, attn_job, &job, pr.tasks(), split);
  return nullptr;
}

OrtStatus* ORT_API_CALL attn_compute(void* kernel, OrtKernelContext* ctx) {
  const AttnKernel& K = *static_cast<const AttnKernel*>(kernel);
  const int64_t kv_w = K.hkv * K.d, q_w = K.hq * K.d;
  Inputs x;
  ROWOP_TRY(read_inputs(ctx, kAttnType, kAttnSlots, 9, 6, q_w, "num_heads * head_dim = ", kv_w, &x));
  if (!cache_shapes_ok(x, kv_w) || x.count[kK] != x.t * kv_w || x.count[kV] != x.t * kv_w) {
    return error(shapes_error(kAttnType, "q [1, T, Hq*D], k and v [1, T, Hkv*D], ", x, kv_w));
  }
  ROWOP_TRY(read_data(kAttnType, &x));
  float* y = nullptr;
  ROWOP_TRY(write_output(ctx, 0, x.qd, &y));
  return attend(ctx, K, x, static_cast<const float*>(x.data[kQ]), static_cast<const float*>(x.data[kK]),
                static_cast<const float*>(x.data[kV]), y);
}

OrtStatus* ORT_API_CALL qkv_compute(void* kernel, OrtKernelContext* ctx) {
  const AttnKernel& K = *static_cast<const AttnKernel*>(kernel);
  const int64_t kv_w = K.hkv * K.d, q_w = K.hq * K.d, in_w = q_w + 2 * kv_w, half = K.d / 2;
  Inputs x;
  ROWOP_TRY(read_inputs(ctx, kQkvType, kQkvSlots, 10, 7, in_w, "(num_heads + 2 kv_heads) * head_dim = ", kv_w, &x));
  const std::vector<int64_t>& cd = x.cos_dims;
  if (!cache_shapes_ok(x, kv_w) || x.count[kPos] != x.t || cd.size() != 2 || cd[1] != half ||
      x.count[kSin] != x.count[kCos]) {
    return error(shapes_error(kQkvType, "qkv [1, T, (Hq+2Hkv)*D], positions [1, T], cos and sin [P, D/2], ", x, kv_w));
  }
  ROWOP_TRY(read_data(kQkvType, &x));
  std::vector<int64_t> od(x.qd);
  float* p[3] = {};
  for (int i = 0; i < 3; ++i) {  // y, then the rotated keys and the values
    od.back() = i == 0 ? q_w : kv_w;
    ROWOP_TRY(write_output(ctx, i, od, &p[i]));
  }
  AttnCall& call = t_call;
  const int64_t T = x.t;
  if (static_cast<int64_t>(call.q.size()) < T * q_w) call.q.resize(T * q_w);
  const int64_t* pos = static_cast<const int64_t*>(x.data[kPos]);
  const float *qkv = static_cast<const float*>(x.data[kQ]), *cs = static_cast<const float*>(x.data[kCos]);
  const float* sn = static_cast<const float*>(x.data[kSin]);
  float *qr = call.q.data(), *kr = p[1], *vr = p[2];
  for (int64_t t = 0; t < T; ++t) {  // split, rotate q and k, copy v
    if (pos[t] < 0 || pos[t] >= cd[0]) {
      return error(std::string(kQkvType) + ": position " + std::to_string(pos[t]) + " outside the rotary tables' " +
                   std::to_string(cd[0]));
    }
    const float *row = qkv + t * in_w, *c = cs + pos[t] * half, *s = sn + pos[t] * half;
    for (int64_t h = 0; h < K.hq; ++h) rotate(row + h * K.d, c, s, half, qr + t * q_w + h * K.d);
    for (int64_t h = 0; h < K.hkv; ++h) rotate(row + q_w + h * K.d, c, s, half, kr + t * kv_w + h * K.d);
    std::memcpy(vr + t * kv_w, row + q_w + kv_w, kv_w * sizeof(float));
  }
  return attend(ctx, K, x, qr, kr, vr, p[0]);
}

OrtStatus* ORT_API_CALL infer_attn_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  return infer_like_input0(ctx, -1, 0);
}

OrtStatus* ORT_API_CALL infer_qkv_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  int64_t hq = 0, hkv = 0, d = 0;
  ROWOP_TRY(infer_attribute(ctx, "num_heads", &hq));
  ROWOP_TRY(infer_attribute(ctx, "kv_heads", &hkv));
  ROWOP_TRY(infer_attribute(ctx, "head_dim", &d));
  ROWOP_TRY(infer_like_input0(ctx, hq * d, 0));
  ROWOP_TRY(infer_like_input0(ctx, hkv * d, 1));
  return infer_like_input0(ctx, hkv * d, 2);
}

const char* ORT_API_CALL attn_name(const OrtCustomOp*) { return kAttnType; }
const char* ORT_API_CALL qkv_name(const OrtCustomOp*) { return kQkvType; }
size_t ORT_API_CALL attn_input_count(const OrtCustomOp*) { return 9; }
size_t ORT_API_CALL qkv_input_count(const OrtCustomOp*) { return 10; }
size_t ORT_API_CALL qkv_output_count(const OrtCustomOp*) { return 3; }
// q, k, v, the cache pair float; past_len, tree_mask int64; the half cache last.
ONNXTensorElementDataType ORT_API_CALL attn_input_type(const OrtCustomOp*, size_t i) {
  if (i >= 7) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  return i < 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
}
// qkv, the cache pair, cos, sin float; past_len, positions, tree_mask int64; the half cache last.
ONNXTensorElementDataType ORT_API_CALL qkv_input_type(const OrtCustomOp*, size_t i) {
  if (i >= 8) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  const bool f = i < 3 || i == 5 || i == 6;
  return f ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
}
// tree_mask and the half cache, the last three, are optional.
OrtCustomOpInputOutputCharacteristic ORT_API_CALL attn_input_required(const OrtCustomOp* op, size_t i) {
  return i + 3 >= op->GetInputTypeCount(op) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

}  // namespace

PathOp attention_op(const Path* path) {
  PathOp op = make_op(path, attn_name, attn_input_type, attn_input_count, create_attn_kernel, attn_compute,
                      infer_attn_shape, destroy_kernel<AttnKernel>);
  op.GetInputCharacteristic = attn_input_required;
  return op;
}

PathOp qkv_attention_op(const Path* path) {
  PathOp op = make_op(path, qkv_name, qkv_input_type, qkv_input_count, create_qkv_kernel, qkv_compute,
                      infer_qkv_shape, destroy_kernel<AttnKernel>);
  op.GetInputCharacteristic = attn_input_required;
  op.GetOutputTypeCount = qkv_output_count;
  return op;
}

}  // namespace rowop

extern "C" {

// For edgespec (ctypes): the op on one thread with a named path, in tasks of rows_per_task query rows
// (0: the op's choice for one worker). dims: T, Hq, Hkv, D, S, past_len, window; tree_mask [T, T] or
// nullptr (a chain); kc / vc: float, or with half != 0 fp16 (the new rows k / v are then rounded to
// fp16 first, as the op does). Returns 0, or -1 (unknown or unsupported path, bad shape).
int edgespec_rowop_attention(const char* name, const int64_t* dims, float scale, const float* q, const float* k,
                             const float* v, const void* kc, const void* vc, const int64_t* tree_mask,
                             int64_t rows_per_task, float* out, int half) {
  using namespace rowop;
  const Path* path = path_named(name);
  AttnProblem pr;
  pr.t = dims[0];
  pr.hq = dims[1];
  pr.hkv = dims[2];
  pr.d = dims[3];
  pr.past = dims[5];
  pr.window = dims[6];
  if (path == nullptr || pr.t < 0 || pr.hq <= 0 || pr.hkv <= 0 || pr.hq % pr.hkv || pr.d <= 0 || pr.past < 0 ||
      pr.past > dims[4] || pr.window < 0) {
    return -1;
  }
  if (pr.t == 0) return 0;
  pr.scale = scale;
  AttnCall call;
  set_rows(pr, q, k, v, kc, vc, half != 0, tree_mask, call);
  pr.out = out;
  pr.rows_per_task = rows_per_task > 0 ? rows_per_task : attn_rows_per_task(pr.rows_per_head(), pr.hkv, 1);
  for (int64_t t = 0; t < pr.tasks(); ++t) path->attention(pr, t);
  return 0;
}

// x [n] float -> out [n] fp16 bits, as the op rounds a half cache's new rows (tests: numpy's astype).
void edgespec_rowop_round_half(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = rowop::float_to_half(x[i]);
}

}  // extern "C"
