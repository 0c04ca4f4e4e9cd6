// The attention's portable variant: attention_impl.h over scalars (V1: std::fma), any CPU.
#include "attention_impl.h"

namespace rowop {

void attention_portable(const AttnProblem& pr, int64_t task) { attn_task<V1>(pr, task); }

}  // namespace rowop
