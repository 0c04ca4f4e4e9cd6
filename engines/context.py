"""The context a folder is loaded with: how many tokens its KV caches hold and their element type.

- Context: `--max-len` (RuntimeConfig.max_len) picks it at load, up to the folder's maximum (the
  manifest's max_len: its export's --max-len, by default the model's own context capped by the
  export's memory budget), rounded up to the folder's kv_bucket; unset, DEFAULT_CONTEXT or the
  maximum, whichever is smaller. The loaded manifest carries it as max_len, so every engine
  allocates its cache for it and the loop stops there; nothing else changes (the graphs read any
  window size). A context whose caches this machine's memory cannot hold is refused.
- Element type: `--kv-dtype fp16|fp32`. A graph declares the caches it reads: its kv_dtype's
  (past_{kind}_{layer}), and fp16 where it also has the KV16_TEMPLATE inputs (the row kernel's
  attention, engines/rowop/attention.h, reads a half cache and rounds the call's own new rows to
  half, so a row's bits stay independent of the call's width). Unset: fp16 where every graph that
  reads the target's cache takes it, else the graphs' own. A model whose graph does not read the
  chosen type (a drafter's own small cache) keeps its kv_dtype.

Refusals come before any allocation, one line each, naming the limit and the figure.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from edgespec.engines.manifest import DTYPES, FUSED_PREFIX, Manifest, ModelSpec, memory_bytes
from edgespec.engines.specs import KV16_TEMPLATE

KV_NAMES = {"fp16": "float16", "fp32": "float32"}  # --kv-dtype -> numpy's name
DEFAULT_CONTEXT = 4096  # tokens a load allocates when --max-len is not given (llama.cpp's default -c)
SHORT = {v: k for k, v in KV_NAMES.items()}


class ContextError(ValueError):
    """A context or cache type the folder cannot be loaded with (the message names the limit)."""


def cache_dtypes(spec) -> tuple[str, ...]:
    """The KV cache dtypes a model's graph reads: its kv_dtype's, and float16 where it declares the
    fp16 cache inputs. () for a model without a cache (multi-token heads)."""
    if not isinstance(spec, ModelSpec):
        return ()
    names = {t.name for t in spec.graph.inputs}
    return (spec.kv_dtype,) + (("float16",) if KV16_TEMPLATE in names and spec.kv_dtype != "float16" else ())


def cache_dtype(manifest: Manifest, spec: ModelSpec) -> str:
    """The dtype of the model's KV cache: the one chosen at load where its graph reads it, else its kv_dtype."""
    chosen = manifest.kv_cache_dtype
    return chosen if chosen is not None and chosen in cache_dtypes(spec) else spec.kv_dtype


def cache_inputs(spec: ModelSpec, cache: np.dtype) -> tuple[list, list]:
    """The cache inputs a call of the model binds to its cache of dtype `cache`, [(graph name template,
    dtype)] (at most one), and those of the other dtype it binds an empty window to, [(template, dtype,
    a one-element buffer)]."""
    dtype = np.dtype(spec.kv_dtype)
    half = "float16" in cache_dtypes(spec) and spec.kv_dtype != "float16"
    pairs = [("past_{kind}_{layer}", dtype)] + ([(KV16_TEMPLATE, np.dtype(np.float16))] if half else [])
    bound = [p for p in pairs if p[1] == cache][:1]
    return bound, [(name, dt, np.zeros(1, dt)) for name, dt in pairs if (name, dt) not in bound]


def _sharing(manifest: Manifest) -> list[ModelSpec]:
    """The target and the graphs that read its cache (a drafter's fused target+head graph)."""
    out = [manifest.target]
    for spec in manifest.models().values():
        if isinstance(spec, ModelSpec) and any(t.name.startswith(FUSED_PREFIX) for t in spec.graph.inputs):
            out.append(spec)
    return out


def minimum_context(manifest: Manifest) -> int:
    """The smallest context the folder's calls fit: its widest call (the prefill chunk, or a verify of
    k + 1 tokens) and room for k + 2 tokens, in whole kv_buckets."""
    need = max(max(manifest.target.graph.widths, default=1), manifest.num_speculative_tokens + 2)
    return -(-need // manifest.kv_bucket) * manifest.kv_bucket


def default_context(manifest: Manifest) -> int:
    """The context a load takes when none is asked: DEFAULT_CONTEXT in whole kv_buckets (at least the
    folder's calls' minimum), or the folder's maximum where that is smaller."""
    bucket = manifest.kv_bucket
    return min(manifest.max_len, max(-(-DEFAULT_CONTEXT // bucket) * bucket, minimum_context(manifest)))


def for_checks(manifest: Manifest, need: int = 0) -> Manifest:
    """The manifest as export-time checks and data tools load it: the default context, or `need`
    tokens in whole kv_buckets where more (a folder's maximum may be the model's own 128k; their
    calls are short), never above the maximum; the graphs' own cache type."""
    need = -(-need // manifest.kv_bucket) * manifest.kv_bucket
    return dataclasses.replace(manifest, max_len=min(manifest.max_len, max(default_context(manifest), need)))


def kv_bytes_per_token(manifest: Manifest) -> int:
    """Bytes one token's K and V rows take in every cache the manifest's choice allocates."""
    return sum(
        s.n_layers * 2 * s.kv_width * DTYPES[cache_dtype(manifest, s)]
        for s in manifest.models().values()
        if isinstance(s, ModelSpec) and not any(t.name.startswith(FUSED_PREFIX) for t in s.graph.inputs)
    )


def at_load(manifest: Manifest, max_len: int | None = None, kv_dtype: str | None = None, provider: str = "cpu"):
    """The manifest as the engines load it: max_len the chosen context, kv_cache_dtype the chosen cache
    type. ContextError (one line) for a context past the folder's maximum or below its widest call, or
    a cache type a graph that reads the target's cache cannot take."""
    top, bucket, folder = manifest.max_len, manifest.kv_bucket, manifest.folder
    if max_len is not None:
        if max_len > top:
            raise ContextError(
                f"--max-len {max_len} is above {folder}'s maximum context of {top} tokens (its export's "
                f"--max-len). Hint: give --max-len {top} or less, or re-export the folder with --max-len {max_len}"
            )
        low = minimum_context(manifest)
        if max_len < low:
            raise ContextError(
                f"--max-len {max_len} is below the {low} tokens {folder}'s calls need (its widest call is "
                f"{max(manifest.target.graph.widths)} tokens, in kv_bucket {bucket} steps). Hint: give --max-len "
                f"{low} or more"
            )
        max_len = min(top, -(-max_len // bucket) * bucket)
    sharing = _sharing(manifest)
    takes = set.intersection(*(set(cache_dtypes(s)) for s in sharing))
    if kv_dtype is None:
        chosen = "float16" if "float16" in takes and provider == "cpu" else manifest.target.kv_dtype
    else:
        chosen = KV_NAMES[kv_dtype]
        if chosen not in takes:
            reads = " and ".join(SHORT.get(d, d) for d in sorted(takes))
            raise ContextError(
                f"--kv-dtype {kv_dtype}: {folder}'s graphs read only {reads} KV caches (an fp16 cache needs the "
                f"row kernel's attention, exported with --int4-kernel rowop by this edgespec). Hint: use "
                f"--kv-dtype {SHORT.get(sorted(takes)[0], 'fp32')}, or re-export the folder"
            )
        if chosen != manifest.target.kv_dtype and provider != "cpu":
            raise ContextError(
                f"--kv-dtype {kv_dtype}: the row kernel's attention that reads it runs on the CPU only, not "
                f"--provider {provider}. Hint: use --kv-dtype {SHORT[manifest.target.kv_dtype]} there"
            )
    if max_len is None:
        max_len = default_context(manifest)
    out = dataclasses.replace(manifest, max_len=max_len, kv_cache_dtype=chosen)
    ram, per_token = memory_bytes(), kv_bytes_per_token(out)
    if ram is not None and per_token * max_len > ram:
        fits = ram // per_token // bucket * bucket
        raise ContextError(
            f"a context of {max_len} tokens needs {per_token * max_len / 2**30:.1f} GiB of KV caches "
            f"({per_token} bytes per token), more than this machine's {ram / 2**30:.1f} GiB of memory. "
            f"Hint: give --max-len {fits} or less"
            + (", or --kv-dtype fp16" if chosen != "float16" and "float16" in takes else "")
        )
    return out
