// The attention's AVX-512 variant (attention_impl.h over V16: 16 lanes).
#include "attention_impl.h"
#include "vec_x86.h"

namespace rowop {

// dots: 8 rows (8 accumulators: FMA latency x throughput), the rest 2 rows x 4 tiles; context: 4 rows
// x 4 vectors (16 accumulators).
template <>
constexpr Tiling kTiling<V16> = {8, 2, 4, 4, 4};

void attention_avx512(const AttnProblem& pr, int64_t task) { attn_task<V16>(pr, task); }

}  // namespace rowop
