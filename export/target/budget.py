"""The folder's maximum context: the model's own, capped by the memory the folder may use.

A folder's maximum costs nothing on disk (the rotary tables are computed at load) and nothing at
load (each load allocates the KV cache of the context it asks for, engines/context.py). What it
promises is that a load may ask for it: weights + a KV cache of that length + a working set fit
the memory budget (--memory-budget, default: this machine's memory). The export prints the figures
and refuses, before any weight is read, a budget the weights alone cannot fit or a --max-len it
cannot hold. It reads the config's numbers alone (sources.TargetShape: config.json or the GGUF
header), so it runs before the drafters' checks, which read the context, and imports no torch.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from edgespec.engines.manifest import memory_bytes
from edgespec.export.target.spec import ExportError

GIB = 2**30
WORKING_SET = 0.6 * GIB  # a load's own buffers beside weights and KV (docs/results/footprint.md: 0.24-0.25 GiB)
FALLBACK_CONTEXT = 2048  # a config that does not say its context (max_position_embeddings)
FOLDER_BYTES_PER_PARAM = {"int4": 1.2, "auto": 1.3, "int8": 1.3, "fp16": 2.0, "fp32": 4.0}  # estimates, >= measured
SOURCE_BYTES_PER_PARAM = {"float32": 4, "float16": 2, "bfloat16": 2}


def weights_estimate(cfg, src, shape) -> int:
    """The folder's weights bytes, estimated from the source's size: a GGUF's blocks are kept
    (folders measured at 1.06-1.15x the file), a safetensors checkpoint's parameters at the
    precision's bytes per parameter."""
    from edgespec.export.target.sources.resolve import GGUF_KINDS

    path = Path(src.path)
    if src.kind in GGUF_KINDS:
        return int(path.stat().st_size * 1.15)
    files = [p for p in path.glob("*") if p.suffix in (".safetensors", ".bin")] if path.is_dir() else []
    n_params = sum(p.stat().st_size for p in files) / SOURCE_BYTES_PER_PARAM.get(shape.dtype, 4)
    return int(n_params * FOLDER_BYTES_PER_PARAM.get(cfg.precision, 4.0))


def kv_bytes_per_token(cfg, shape) -> tuple[int, str]:
    """KV cache bytes per context position at the cache type a CPU load picks by default (fp16 where
    the row kernel's attention reads it: int4 folders; else fp32), and that type's name."""
    half = cfg.precision in ("int4", "auto", "fp16")
    return shape.n_layers * 2 * shape.n_kv_heads * shape.head_dim * (2 if half else 4), "fp16" if half else "fp32"


def resolve_context(cfg, src, shape, say=lambda line: print(line, file=sys.stderr)):
    """cfg with max_len set: the given --max-len (checked against the budget when one is given), or the
    model's own context capped by the budget, in whole kv_buckets. ExportError (one line) when the
    budget cannot hold the weights and the smallest context."""
    if shape is None or not shape.n_kv_heads:  # a hub id: nothing to read before it loads
        return cfg if cfg.max_len is not None else dataclasses.replace(cfg, max_len=FALLBACK_CONTEXT)
    own = shape.context
    per_token, kv_name = kv_bytes_per_token(cfg, shape)
    weights = weights_estimate(cfg, src, shape)
    given = cfg.memory_budget is not None
    budget = int(cfg.memory_budget * GIB) if given else memory_bytes()
    whose = "--memory-budget" if given else "this machine's memory; --memory-budget to change"
    need_min = max(cfg.prefill_chunk, cfg.k + 2, cfg.kv_bucket)
    if budget is not None:
        room = budget - weights - WORKING_SET
        fits = int(max(room, 0) // per_token // cfg.kv_bucket * cfg.kv_bucket)
        if fits < need_min and (given or cfg.max_len is None):
            raise ExportError(
                f"the memory budget {budget / GIB:.1f} GiB ({whose}) cannot hold {src.name}: its weights "
                f"(~{weights / GIB:.2f} GiB) and a {WORKING_SET / GIB:.1f} GiB working set leave "
                f"{max(room, 0) / GIB:.2f} GiB for a KV cache of {per_token / 1024:.1f} KiB per token ({kv_name}), "
                f"less than its smallest context of {need_min} tokens. Hint: raise --memory-budget, or "
                "export a smaller model or precision"
            )
        if cfg.max_len is not None and given and cfg.max_len > fits:
            total = (weights + WORKING_SET + per_token * cfg.max_len) / GIB
            raise ExportError(
                f"--max-len {cfg.max_len} does not fit --memory-budget {cfg.memory_budget:g} GiB: weights "
                f"~{weights / GIB:.2f} GiB + {WORKING_SET / GIB:.1f} GiB working set + KV {per_token / 1024:.1f} KiB "
                f"per token ({kv_name}) x {cfg.max_len} = {total:.2f} GiB. "
                f"Hint: give --max-len {fits} or less, or raise --memory-budget"
            )
    if cfg.max_len is not None:
        return cfg
    top = own // cfg.kv_bucket * cfg.kv_bucket if own else FALLBACK_CONTEXT
    max_len = top if budget is None else min(top, fits)
    kv = per_token * max_len
    why = "the model's own" if max_len == top else f"capped by the memory budget; the model's own is {own}"
    if budget is not None:
        say(
            f"edgespec: context up to {max_len} tokens ({why}): KV {per_token / 1024:.1f} KiB per token ({kv_name}), "
            f"{kv / GIB:.2f} GiB at the maximum; weights ~{weights / GIB:.2f} GiB; memory budget "
            f"{budget / GIB:.1f} GiB ({whose}). Each load picks its own context (--max-len) up to it"
        )
    return dataclasses.replace(cfg, max_len=max_len)
