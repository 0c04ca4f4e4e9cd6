"""A model loaded whole through transformers (fp32): the export's fallback weight source, and the
quantized blocks of a GGUF it was loaded from, under the loaded model's names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgespec.export.target.sources.resolve import GGUF_KINDS, Source, SourceError

if TYPE_CHECKING:
    from edgespec.export.target.quant.blocks import Blocks, GgufWeights


def read_blocks(path: str, model, hf_weights: dict[str, np.ndarray], decode_blocks: bool = True) -> GgufWeights:
    """The GGUF at `path`'s quantized 2-D tensors as Blocks under the names of `model` (the
    transformers model loaded from it), each checked against `hf_weights` (its float32 state dict).
    decode_blocks False: the types only (a float export records where its weights came from)."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    from edgespec.export.target.quant.blocks import DECODERS, FLOATS, GgufWeights, decode
    from edgespec.export.target.sources.gguf_header import read_header

    h = read_header(path)
    processor = TENSOR_PROCESSORS.get(h.architecture, TensorProcessor)(config=model.config.to_dict())
    names = get_gguf_hf_weights_map(model, processor)  # GGUF name -> HF name
    data = np.memmap(path, np.uint8, mode="r")
    blocks, types, not_kept = {}, {}, {}
    for t in h.tensors:
        hf = names.get(t.name)
        if hf is None or hf not in hf_weights:
            continue
        type_name = gguf.GGMLQuantizationType(t.type_id).name
        types[hf] = type_name
        if type_name in FLOATS or len(t.dims) != 2:
            continue
        if not decode_blocks:
            not_kept[hf] = "--gguf-blocks requantize"
            continue
        if type_name not in DECODERS:
            not_kept[hf] = f"{type_name} has no exact MatMulNBits form"
            continue
        per_block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.type_id)]
        row_bytes = t.dims[0] // per_block * type_size
        start = h.data_offset + t.offset
        raw = data[start : start + row_bytes * t.dims[1]].reshape(t.dims[1], row_bytes)
        b = decode(raw, type_name)
        b = _processed(processor, b, t.name)
        if not np.array_equal(b.dequantized(), hf_weights[hf]):
            not_kept[hf] = "its blocks do not dequantize to the loaded weight (name or row order mapping)"
            continue
        blocks[hf] = b
    tied = "lm_head.weight" in hf_weights and "lm_head.weight" not in types
    embed = "model.embed_tokens.weight"
    if tied and embed in types:  # a tied LM head is the embedding table's tensor
        types["lm_head.weight"] = types[embed]
        if embed in blocks and np.array_equal(hf_weights["lm_head.weight"], hf_weights[embed]):
            blocks["lm_head.weight"] = blocks[embed]
        if embed in not_kept:
            not_kept["lm_head.weight"] = not_kept[embed]
    return GgufWeights(blocks, types, not_kept)


def _processed(processor, b: Blocks, gguf_name: str) -> Blocks:
    """The row order transformers' GGUF loader gives the dequantized tensor (llama's q/k
    permutation), applied to codes, scales, zero points and mins alike (blocks run along the input
    dim, so whole rows move and every block stays intact)."""
    from edgespec.engines.rowop import SubScales

    def rows(a):
        return None if a is None else np.ascontiguousarray(processor.process(weights=a, name=gguf_name).weights)

    sub = None if b.sub is None else SubScales(*(rows(a) for a in b.sub.fields()))
    return replace(
        b, codes=rows(b.codes), scales=rows(b.scales), zero_points=rows(b.zero_points), mins=rows(b.mins), sub=sub
    )


def load(source: Source):
    """Load (model, tokenizer) with transformers, fp32, eval mode. Heavy: torch + transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": torch.float32}
    if source.kind in GGUF_KINDS:
        p = Path(source.path)
        kwargs["gguf_file"] = p.name
        where = str(p.parent)
    else:
        where = source.path
    try:
        tok = AutoTokenizer.from_pretrained(where, **{k: v for k, v in kwargs.items() if k == "gguf_file"})
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(f"could not load {source.kind} model from {source.path}: {e}") from e
    except RuntimeError as e:  # transformers: the checkpoint's tensors do not fit the config it built
        if "mismatched" not in str(e):
            raise
        raise SourceError(
            f"could not load {source.kind} model from {source.path}: its tensors' shapes do not fit the config "
            "transformers read from it (the load report above names them). Hint: for a GGUF, export the "
            "model's HF folder instead"
        ) from e
    # transformers keeps the GGUF quantizer on models loaded that way; drop it (save would fail).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        model.config.quantization_config = None
    return model.eval(), tok


def hf_weights(model) -> dict[str, np.ndarray]:
    """A Hugging Face model's state dict as float32 arrays (what the graph writers take)."""
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
