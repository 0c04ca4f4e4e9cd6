"""Which dtype the CPU's matrix units make worth training and generating data in (torch).

CPUs with bf16 matrix instructions (AVX512_BF16, AMX) run bf16 matmuls several times faster than
fp32; elsewhere torch emulates bf16 and it is slower. The probe reads the CPU flags and times one
matmul of a drafter's size both ways (~1 s): bf16 only where a flag says the hardware has it AND
the timing agrees, so a flag that lies (a VM, a kernel that hides AMX) or a slow bf16 path falls
back to fp32. `decide` is the pure rule (tests feed it fake flags and timings); `choose` runs it
once per process.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of bf16 matrix instructions, best first
MIN_SPEEDUP = 1.3  # bf16 must beat fp32 by this factor on the probe matmul to be chosen
SHAPE = (2048, 576, 1536)  # [M, K] x [K, N]: a batch of rows through a 135M target's MLP-sized matmul
COMPUTES = ("auto", "bf16", "fp32")  # what --compute accepts


@dataclass(frozen=True)
class Compute:
    """The compute dtype chosen for the heavy matmuls of training or data generation."""

    dtype: str  # "bf16" (autocast, fp32 master weights and loss) or "fp32"
    reason: str  # why, in one line (flags and timings)
    flag: str | None = None  # the bf16 matrix flag the CPU shows (None: none)
    fp32_ms: float | None = None  # probe matmul time in fp32 (None: not timed)
    bf16_ms: float | None = None  # probe matmul time in bf16 (None: not timed)

    @property
    def bf16(self) -> bool:
        return self.dtype == "bf16"

    def record(self) -> dict:
        """What a training record or progress line keeps of the choice."""
        out: dict = {"compute": self.dtype, "compute_reason": self.reason}
        if self.fp32_ms is not None and self.bf16_ms is not None:
            out["probe_ms"] = {"fp32": round(self.fp32_ms, 2), "bf16": round(self.bf16_ms, 2)}
        return out


class ComputeError(ValueError):
    """A --compute value the probe does not know."""


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags (empty where /proc/cpuinfo is missing: not Linux)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):  # x86 / arm
            return set(line.split(":", 1)[1].split())
    return set()


def decide(
    requested: str,
    flags: set[str],
    fp32_ms: float | None = None,
    bf16_ms: float | None = None,
    min_speedup: float = MIN_SPEEDUP,
) -> Compute:
    """The rule: "fp32" and "bf16" are taken as asked; "auto" picks bf16 only when the CPU has a bf16
    matrix flag and the timed bf16 matmul is >= min_speedup x faster than fp32."""
    if requested not in COMPUTES:
        raise ComputeError(f"--compute {requested!r}: one of {', '.join(COMPUTES)}")
    flag = next((f for f in BF16_FLAGS if f in flags), None)
    timed = {"fp32_ms": fp32_ms, "bf16_ms": bf16_ms}
    if requested == "fp32":
        return Compute("fp32", "fp32 as asked (--compute fp32)", flag, **timed)
    if requested == "bf16":
        note = "" if flag else " (no bf16 matrix flag: torch emulates it, likely slower)"
        return Compute("bf16", f"bf16 as asked (--compute bf16){note}", flag, **timed)
    if flag is None:
        return Compute("fp32", f"fp32: the CPU shows none of {'/'.join(BF16_FLAGS)}", None, **timed)
    if fp32_ms is None or bf16_ms is None:
        return Compute("fp32", f"fp32: {flag} present but the bf16 matmul was not timed", flag, **timed)
    speedup = fp32_ms / max(bf16_ms, 1e-9)
    m, k, n = SHAPE
    timing = f"[{m},{k}]x[{k},{n}] fp32 {fp32_ms:.1f} ms, bf16 {bf16_ms:.1f} ms ({speedup:.2f}x)"
    if speedup >= min_speedup:
        return Compute("bf16", f"bf16: {flag} and {timing}", flag, **timed)
    return Compute("fp32", f"fp32: {flag} but bf16 is < {min_speedup:g}x faster: {timing}", flag, **timed)


def time_matmul(budget_s: float = 1.0, shape: tuple[int, int, int] = SHAPE) -> tuple[float, float]:
    """(fp32 ms, bf16 ms): the median of a few timed matmuls of `shape` each, alternating the two
    dtypes so a neighbour's load hits both alike; about `budget_s` seconds in all."""
    import torch

    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    pairs = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}
    times: dict[str, list[float]] = {d: [] for d in pairs}
    for x, y in pairs.values():  # an untimed first pass: kernels picked, pages touched
        x @ y
    t_end = time.perf_counter() + budget_s
    while len(times["fp32"]) < 2 or (time.perf_counter() < t_end and len(times["fp32"]) < 9):
        for d, (x, y) in pairs.items():
            t = time.perf_counter()
            x @ y
            times[d].append((time.perf_counter() - t) * 1e3)
    return statistics.median(times["fp32"]), statistics.median(times["bf16"])


@functools.cache
def choose(requested: str = "auto") -> Compute:
    """The compute dtype for this process ("auto": flags + the timed probe, once; the answer is kept)."""
    flags = cpu_flags()
    if requested == "auto" and any(f in flags for f in BF16_FLAGS):
        return decide(requested, flags, *time_matmul())
    return decide(requested, flags)


def autocast(compute: Compute):
    """The context the heavy forward/backward run in: bf16 autocast (weights stay fp32 masters, the
    matmuls run in bf16) or nothing."""
    import contextlib

    import torch

    if compute.bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def default_threads() -> int:
    """Threads when none are asked for: every core this process may run on."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
