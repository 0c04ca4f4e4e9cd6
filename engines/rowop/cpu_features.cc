// Which paths this CPU runs (cpuid, and the OS saving the vector registers: xgetbv), and the one a
// session gets: the best this CPU runs, or the one EDGESPEC_ROWOP_ISA names (portable, avx2, avxvnni,
// avx512vnni; refused where the CPU lacks it).
#include "cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace rowop {

// The AVX-VNNI path has no attention or SwiGLU of its own: AVX2's.
const Path kPaths[kPathCount] = {
    {"avx512vnni", &kMatmulAvx512Vnni, attention_avx512, swiglu_avx512},
    {"avxvnni", &kMatmulAvxVnni, attention_avx2, swiglu_avx2},
    {"avx2", &kMatmulAvx2, attention_avx2, swiglu_avx2},
    {"portable", &kMatmulPortable, attention_portable, swiglu_portable},
};

namespace {

struct Cpu {
  bool avx2 = false, f16c = false, fma = false, avxvnni = false, avx512 = false, avx512vnni = false;
};

Cpu detect_cpu() {
  Cpu c;
  unsigned a, b, cx, d;
  if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
  const bool osxsave = cx & (1u << 27), avx = cx & (1u << 28);
  c.f16c = cx & (1u << 29);
  c.fma = cx & (1u << 12);
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm_os = avx && (xcr0 & 0x6) == 0x6;
  const bool zmm_os = ymm_os && (xcr0 & 0xE0) == 0xE0;
  if (__get_cpuid_max(0, nullptr) < 7) return c;
  __cpuid_count(7, 0, a, b, cx, d);
  c.avx2 = ymm_os && c.f16c && c.fma && (b & (1u << 5));  // FMA: the attention's 256-bit path
  c.avx512 = zmm_os && (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));  // F, BW, VL
  c.avx512vnni = c.avx512 && (cx & (1u << 11));
  __cpuid_count(7, 1, a, b, cx, d);
  c.avxvnni = c.avx2 && (a & (1u << 4));
  return c;
}

const Cpu& cpu() {
  static const Cpu c = detect_cpu();
  return c;
}

}  // namespace

bool runs(const Path& path) {
  const Cpu& c = cpu();
  if (&path == &kPaths[0]) return c.avx512vnni;
  if (&path == &kPaths[1]) return c.avxvnni;
  if (&path == &kPaths[2]) return c.avx2;
  return true;
}

const Path* choose(std::string* why) {
  const char* want = std::getenv("EDGESPEC_ROWOP_ISA");
  if (want == nullptr || *want == 0 || std::strcmp(want, "auto") == 0) {
    for (const Path& path : kPaths) {
      if (runs(path)) return &path;
    }
  }
  for (const Path& path : kPaths) {
    if (std::strcmp(path.name, want) == 0) {
      if (runs(path)) return &path;
      *why = std::string("EDGESPEC_ROWOP_ISA=") + want + ": this CPU does not run that path";
      return nullptr;
    }
  }
  *why = std::string("EDGESPEC_ROWOP_ISA=") + want + ": not a path (portable, avx2, avxvnni, avx512vnni, auto)";
  return nullptr;
}

const Path* path_named(const char* name) {
  for (const Path& path : kPaths) {
    if (std::strcmp(path.name, name) == 0 && runs(path)) return &path;
  }
  return nullptr;
}

}  // namespace rowop

extern "C" {

// For edgespec (ctypes): the path a session would get now ("" and *why set where refused), and
// whether this CPU runs a named path.
const char* edgespec_rowop_path(const char** why) {
  static thread_local std::string msg;
  msg.clear();
  const rowop::Path* path = rowop::choose(&msg);
  *why = msg.c_str();
  return path ? path->name : "";
}

int edgespec_rowop_runs(const char* name) {
  for (const rowop::Path& path : rowop::kPaths) {
    if (std::strcmp(path.name, name) == 0) return rowop::runs(path) ? 1 : 0;
  }
  return 0;
}

}  // extern "C"
