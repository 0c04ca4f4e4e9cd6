"""GGUF models in the tests: the type mixes they are written with and gguf's own dequantization."""

import numpy as np

from edgespec.engines.manifest import load_manifest
from edgespec.export.target.exporter import ExportConfig, export

STORED = {  # a graph linear -> the GGUF kinds whose rows it packs, in order
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "o": ("attn_output",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
}


MIXED = {  # every K-quant and legacy type in one model, q/k/v of three kinds in one packed linear
    "attn_q": "Q4_K",
    "attn_k": "Q5_K",
    "attn_v": "Q6_K",
    "attn_output": "Q3_K",
    "ffn_gate": "Q2_K",
    "ffn_up": "Q5_1",
    "ffn_down": "Q4_0",
    "output": "Q6_K",
}


def export_manifest(src, out, **kw):
    """Export a tiny target at small buckets (int4 unless kw says) and load the folder's manifest."""
    kw = dict(max_len=128, k=3, prefill_chunk=16, kv_bucket=32, precision="int4", trees=True, progress=False) | kw
    return load_manifest(export(ExportConfig(target=str(src), out=str(out), **kw)))


def ggufs_own_rows(path, kind: str, layer: int, n_heads: int, n_kv: int) -> np.ndarray:
    """gguf's dequantization of blk.<layer>.<kind>, in the HF row order (llama's q/k unpermuted)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == f"blk.{layer}.{kind}.weight")
    w = gguf.quants.dequantize(t.data, t.tensor_type)
    if kind in ("attn_q", "attn_k"):
        heads = n_heads if kind == "attn_q" else n_kv
        w = w.reshape(heads, -1, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)  # llama.cpp's permute undone
    return w
