// The attention's portable path: attention_impl.h over scalars (std::fma), any CPU.
#include "attention_impl.h"

namespace rowop {

const AttnIsa kAttnPortable = {"portable", attn_task<V1>, swiglu<V1>};

}  // namespace rowop
