"""Random-weight models in the exact shapes and file layouts of real 1B-8B configs, so the memory and
time of real-size exports can be measured without downloading anything.

    python tools/synthetic_model.py --config llama-3.2-1b --out /tmp/l1b                   # HF folder, bf16
    python tools/synthetic_model.py --config llama-3.1-8b --format gguf-q4_k_m --out /tmp/l8b.gguf

--format safetensors: an HF folder (config.json, bf16 *.safetensors shards of <= 2 GB with their
index, a tokenizer of the config's vocabulary size). --format gguf-q8_0 / gguf-q4_k_m: one GGUF in
llama.cpp's layout for that type (Q4_K_M: Q6_K for the output, attn_v and ffn_down of every other
layer, Q4_K elsewhere, as llama.cpp's mix does; norms F32), the vocabulary in its header. Quantized
tensors are random blocks with fp16 scales sized for weights of std ~0.02 (gguf-py cannot quantize
K-quants, and quantizing 8B random floats would take an hour); float tensors are random normal.
Written one tensor at a time: peak memory is one shard (safetensors) or one tensor (GGUF).
The weights are random: the models generate noise, at the speed and memory of the real thing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SyntheticConfig:
    model_type: str  # HF model_type (and GGUF architecture)
    hidden_size: int  # residual width
    intermediate_size: int  # MLP width
    n_layers: int  # decoder layers
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads
    head_dim: int  # per-head width
    vocab_size: int  # tokenizer and LM-head rows
    tied: bool  # LM head shares the embedding
    rope_theta: float  # RoPE base
    rope_scaling: dict | None  # HF rope_scaling (llama3), None: plain
    max_position_embeddings: int  # the config's context
    rms_norm_eps: float  # RMSNorm epsilon


LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}
CONFIGS = {  # the public configs' numbers (config.json of each model on the HF hub)
    "llama-3.2-1b": SyntheticConfig(
        "llama", 2048, 8192, 16, 32, 8, 64, 128256, True, 500000.0,
        LLAMA3_ROPE | {"factor": 32.0, "original_max_position_embeddings": 8192}, 131072, 1e-5,
    ),
    "llama-3.2-3b": SyntheticConfig(
        "llama", 3072, 8192, 28, 24, 8, 128, 128256, True, 500000.0,
        LLAMA3_ROPE | {"factor": 32.0, "original_max_position_embeddings": 8192}, 131072, 1e-5,
    ),
    "qwen3-4b": SyntheticConfig("qwen3", 2560, 9728, 36, 32, 8, 128, 151936, True, 1000000.0, None, 40960, 1e-6),
    "llama-3.1-8b": SyntheticConfig(
        "llama", 4096, 14336, 32, 32, 8, 128, 128256, False, 500000.0,
        LLAMA3_ROPE | {"factor": 8.0, "original_max_position_embeddings": 8192}, 131072, 1e-5,
    ),
}  # fmt: skip
FORMATS = ("safetensors", "gguf-q8_0", "gguf-q4_k_m")
SHARD_BYTES = 2 * 10**9
STD = 0.02  # weights' standard deviation


def tensors(c: SyntheticConfig) -> list[tuple[str, str, tuple[int, ...]]]:
    """(HF name, GGUF name, HF shape [out, in]) of every tensor, in file order."""
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    out = [("model.embed_tokens.weight", "token_embd.weight", (c.vocab_size, c.hidden_size))]
    for i in range(c.n_layers):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (p + "input_layernorm.weight", g + "attn_norm.weight", (c.hidden_size,)),
            (p + "self_attn.q_proj.weight", g + "attn_q.weight", (q, c.hidden_size)),
            (p + "self_attn.k_proj.weight", g + "attn_k.weight", (kv, c.hidden_size)),
            (p + "self_attn.v_proj.weight", g + "attn_v.weight", (kv, c.hidden_size)),
            (p + "self_attn.o_proj.weight", g + "attn_output.weight", (c.hidden_size, q)),
            (p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (c.hidden_size,)),
            (p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (c.intermediate_size, c.hidden_size)),
            (p + "mlp.up_proj.weight", g + "ffn_up.weight", (c.intermediate_size, c.hidden_size)),
            (p + "mlp.down_proj.weight", g + "ffn_down.weight", (c.hidden_size, c.intermediate_size)),
        ]
        if c.model_type == "qwen3":
            out += [
                (p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", (c.head_dim,)),
                (p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", (c.head_dim,)),
            ]
    out.append(("model.norm.weight", "output_norm.weight", (c.hidden_size,)))
    if not c.tied:
        out.append(("lm_head.weight", "output.weight", (c.vocab_size, c.hidden_size)))
    return out


def hf_config(c: SyntheticConfig) -> dict:
    from transformers import AutoConfig

    from edgespec.export.target.arch import hf_sizes

    kw = hf_sizes(c) | dict(
        tie_word_embeddings=c.tied,
        rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    if c.rope_scaling:
        kw["rope_scaling"] = dict(c.rope_scaling)
    return AutoConfig.for_model(c.model_type, **kw).to_dict()


def vocabulary(n: int) -> list[str]:
    """n tokens: GPT-2's 256 byte characters, then characters of the supplementary planes (no
    surrogates, which GGUF's UTF-8 refuses), the last one the first two byte characters together:
    the one merge (MERGE) a BPE vocabulary needs for llama.cpp to load it."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = list(bytes_to_unicode().values())
    vocab = byte_chars + [chr(0x10000 + i) for i in range(n - len(byte_chars))]
    if n > len(byte_chars) + 1:
        vocab[-1] = byte_chars[0] + byte_chars[1]
    return vocab


def merges(n: int) -> list[str]:
    """The vocabulary's one merge (llama.cpp refuses a BPE vocabulary without merges)."""
    v = vocabulary(n)
    return [f"{v[-1][0]} {v[-1][1]}"] if len(v[-1]) == 2 else []


def write_tokenizer(folder: Path, n: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocabulary(n))}, unk_token=vocabulary(1)[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=vocabulary(2)[1], eos_token=vocabulary(3)[2])
    fast.save_pretrained(folder)


def write_safetensors(c: SyntheticConfig, out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(c), indent=1))
    write_tokenizer(out, c.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    names = tensors(c)
    shards, shard, size = [], {}, 0
    for name, _, shape in names:
        nbytes = int(np.prod(shape)) * 2
        if shard and size + nbytes > SHARD_BYTES:
            shards.append(shard)
            shard, size = {}, 0
        shard[name] = shape
        size += nbytes
    shards.append(shard)
    index = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        arrays = {
            n: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=gen) * STD).to(torch.bfloat16)
            for n, s in shard.items()
        }
        save_file(arrays, out / fname, metadata={"format": "pt"})
        del arrays
        index |= dict.fromkeys(shard, fname)
    total = sum(int(np.prod(s)) * 2 for _, _, s in names)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1)
    )


def _gguf_type(fmt: str, gguf_name: str, n_layers: int, tied: bool):
    """llama.cpp's choice of type per tensor for the two formats (Q4_K_M: its use_more_bits layers)."""
    import gguf

    T = gguf.GGMLQuantizationType
    if fmt == "gguf-q8_0":
        return T.Q8_0
    if gguf_name == "output.weight" or gguf_name == "token_embd.weight" and tied:  # the LM head's table
        return T.Q6_K
    if gguf_name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(gguf_name.split(".")[1])
        more_bits = i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2
        return T.Q6_K if more_bits else T.Q4_K
    return T.Q4_K


_SCALE_AT = {"Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}  # byte offsets of a block's fp16 d (and dmin)


def random_blocks(rng, qtype, shape: tuple[int, int]) -> np.ndarray:
    """Random blocks of a GGUF type for a [out, in] tensor, fp16 scales sized for weights of std STD."""
    import gguf

    per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (shape[0] * shape[1] // per_block, type_size), dtype=np.uint8)
    probe = raw[:64].copy()
    for off in _SCALE_AT[qtype.name]:
        probe[:, off : off + 2] = np.ones((len(probe), 1), np.float16).view(np.uint8)
    std = float(gguf.quants.dequantize(probe, qtype).std())
    d = (rng.uniform(0.5, 1.5, (len(raw), 1)) * STD / std).astype(np.float16).view(np.uint8)
    for off in _SCALE_AT[qtype.name]:
        raw[:, off : off + 2] = d
    return raw.reshape(shape[0], -1)


def write_gguf(c: SyntheticConfig, fmt: str, out: Path, seed: int) -> None:
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    part = out.with_suffix(".part")  # renamed at the end: an interrupted run leaves no .gguf
    w = gguf.GGUFWriter(str(part), c.model_type)
    header = {  # GGUFWriter.add_<key>(value): the architecture's metadata, in llama.cpp's names
        "name": f"synthetic {c.model_type}",
        "block_count": c.n_layers,
        "context_length": c.max_position_embeddings,
        "embedding_length": c.hidden_size,
        "feed_forward_length": c.intermediate_size,
        "head_count": c.n_heads,
        "head_count_kv": c.n_kv_heads,
        "key_length": c.head_dim,
        "value_length": c.head_dim,
        "rope_dimension_count": c.head_dim,
        "rope_freq_base": c.rope_theta,
        "layer_norm_rms_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size,
    }
    for key, value in header.items():
        getattr(w, f"add_{key}")(value)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if fmt == "gguf-q8_0" else gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocabulary(c.vocab_size))
    w.add_token_scores([0.0] * c.vocab_size)
    w.add_token_types([1] * c.vocab_size)
    w.add_token_merges(merges(c.vocab_size))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    plan = []
    for _, name, shape in tensors(c):
        qtype = None if len(shape) == 1 else _gguf_type(fmt, name, c.n_layers, c.tied)
        if qtype is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            nbytes = shape[0] * shape[1] // per_block * type_size
            w.add_tensor_info(name, (shape[0], shape[1] // per_block * type_size), np.dtype(np.uint8), nbytes, qtype)
        plan.append((shape, qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for shape, qtype in plan:  # one tensor in memory at a time
        data = np.ones(shape, np.float32) if qtype is None else random_blocks(rng, qtype, shape)
        w.write_tensor_data(data)
    w.close()
    part.replace(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, choices=sorted(CONFIGS))
    p.add_argument("--format", default="safetensors", choices=FORMATS)
    p.add_argument("--out", required=True, help="folder (safetensors) or .gguf file to write")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    c, out, t0 = CONFIGS[a.config], Path(a.out), time.perf_counter()
    if a.format == "safetensors":
        write_safetensors(c, out, a.seed)
    else:
        write_gguf(c, a.format, out if out.suffix == ".gguf" else out / f"{a.config}-{a.format[5:]}.gguf", a.seed)
    n = sum(int(np.prod(s)) for _, _, s in tensors(c))
    print(f"{a.config} ({n / 1e9:.2f}B parameters, {a.format}) -> {out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
