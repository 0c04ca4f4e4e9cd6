// The instruction-set paths of the library and the one a session gets (cpu_features.cc): a path is
// one variant of each op, chosen together when a session registers the library.
#pragma once

#include <string>

#include "attention.h"
#include "matmul.h"
#include "swiglu.h"

namespace rowop {

struct Path {
  const char* name;  // portable, avx2, avxvnni, avx512vnni (edgespec.engines.rowop.PATHS)
  const MatmulIsa* matmul;  // RowMatMul's variant
  AttnTaskFn attention;  // RowAttention's and RowQkvAttention's
  SwiGluFn swiglu;  // RowSwiGLU's
};

constexpr int kPathCount = 4;
extern const Path kPaths[kPathCount];  // best first

// This CPU (and its OS, saving the vector registers) runs the path.
bool runs(const Path& path);
// The path a session gets: EDGESPEC_ROWOP_ISA's, or the best this CPU runs. nullptr + why: refused.
const Path* choose(std::string* why);
// The path of that name where this CPU runs it, else nullptr (the test entry points).
const Path* path_named(const char* name);

}  // namespace rowop
