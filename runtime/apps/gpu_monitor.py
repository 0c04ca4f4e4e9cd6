"""GPU utilization sampled through NVML while a benchmark runs (nvidia-ml-py, optional)."""

from __future__ import annotations

import threading


class GpuSampler:
    """Samples utilization and memory of one GPU every `period_s` in a background thread."""

    def __init__(self, device: int = 0, period_s: float = 0.05) -> None:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        self.period_s = period_s
        self.util: list[int] = []
        self.mem_mib: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.util.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            self.mem_mib.append(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        if not self.util:
            return {}
        return {
            "gpu_util_mean_pct": sum(self.util) / len(self.util),
            "gpu_util_max_pct": max(self.util),
            "gpu_mem_used_max_mib": max(self.mem_mib),
            "samples": len(self.util),
            "gpu": self.nvml.nvmlDeviceGetName(self.handle),
        }


def maybe_sampler(provider: str):
    """A sampler when a GPU provider runs and NVML can be had; otherwise None."""
    if provider == "cpu":
        return None
    try:
        return GpuSampler()
    except Exception:  # no NVML library, no driver, no GPU: the bench runs without it
        return None
