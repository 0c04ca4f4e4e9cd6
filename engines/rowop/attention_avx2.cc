// The attention's AVX2 variant (attention_impl.h over V8: 8 lanes with FMA, F16C widening a half
// cache): the avx2 and avxvnni paths' attention.
#include "attention_impl.h"
#include "vec_x86.h"

namespace rowop {

// dots: 4 rows x 2 vectors (8 accumulators), the rest 1 row x 4 tiles x 2 vectors; context: 2 rows x
// 4 vectors (8 accumulators).
template <>
constexpr Tiling kTiling<V8> = {4, 1, 4, 2, 4};

void attention_avx2(const AttnProblem& pr, int64_t task) { attn_task<V8>(pr, task); }

}  // namespace rowop
