"""Tiny random Llama-family models (HF folders with a char-level tokenizer) for fast tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# the export settings of the tiny test engines (tests/conftest.py tiny_engine): small buckets, so
# every phase and tree path is exercised in a few tokens
TINY_EXPORT = dict(max_len=256, k=8, prefill_chunk=16, kv_bucket=32, precision="fp32", trees=True, progress=False)

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def tokenizer_files(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(32)} | {chr(i): i for i in range(32, 256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<1>", unk_token="<0>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def make_tiny(model_type: str, folder: Path, seed: int = 0, **overrides) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    kw = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=1,
        bos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=model_type == "llama",
    )
    if model_type == "qwen3":
        kw["head_dim"] = 32  # Qwen3 decouples head_dim from hidden_size / heads
    kw.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kw)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random norms and biases, so a missing op would show in the parity check
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    tokenizer_files(folder)
    return folder


def assert_rows_bitwise_alike(m, label="") -> None:
    """A token's logits are the same bits in a prefill, verify and decode call of a folder's target
    (manifest m): rows 16.. computed at the prefill width, at verify widths 4, 3, 2 and one by one."""
    from edgespec.engines.ort import OrtModel

    e = OrtModel(m, m.target)
    toks = np.random.default_rng(1).integers(0, 256, 60)
    e.forward(toks[:16], 0)
    e.commit(0, 16)
    rows = {16: e.forward(toks[16:32], 16).copy()}  # prefill width
    for w in (4, 3, 2):
        rows[w] = e.forward(toks[16 : 16 + w], 16).copy()
    for i in range(4):
        one = e.forward(toks[16 + i : 17 + i], 16 + i)
        e.commit(16 + i, 1)
        for w, r in rows.items():
            if i < w:
                assert np.array_equal(one[0], r[i]), (label, w, i, np.abs(one[0] - r[i]).max())


# linear weight kinds of a llama GGUF (blk.N.<kind>.weight) and their [out, in] sizes by config
GGUF_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def make_tiny_gguf(path: Path, types: dict[str, str], seed: int = 0, hidden: int = 256, tied: bool = True) -> Path:
    """A tiny random llama as a GGUF file written by the gguf package itself: its linears in the
    GGUF types `types` gives per kind (GGUF_LINEARS, plus "token_embd" and "output"; default Q8_0),
    norms F32, a byte-level BPE vocabulary of 256 tokens. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 are quantized
    from random floats with gguf.quants; the K-quants (which gguf-py cannot quantize) are random
    blocks with small fp16 scales. Rows of 256 inputs, so every K-quant fits."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    n_layers, n_heads, n_kv, inter, vocab = 2, 4, 2, 2 * hidden, 256
    head_dim = hidden // n_heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(n_layers)
    w.add_context_length(1024)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(list(bytes_to_unicode().values()))
    w.add_token_types([1] * vocab)
    w.add_token_scores([0.0] * vocab)  # no merges: transformers derives none from single characters
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, n_out: int, n_in: int, kind: str) -> None:
        qtype = gguf.GGMLQuantizationType[types.get(kind, "Q8_0")]
        if qtype.name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
            per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (n_out * n_in // per_block, type_size), dtype=np.uint8)
            at = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[qtype.name]

            def set_d(d: np.ndarray) -> None:  # d (and dmin) of every super-block
                for off in at:
                    raw[:, off : off + 2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)

            set_d(np.ones(len(raw)))
            std = gguf.quants.dequantize(raw, qtype).std()
            set_d(rng.uniform(0.5, 1.5, len(raw)) * 0.05 / std)  # weights of std ~0.05, like the others
            data = raw.reshape(n_out, -1)
        else:
            data = gguf.quants.quantize(rng.normal(0, 0.05, (n_out, n_in)).astype(np.float32), qtype)
        w.add_tensor(name, data, raw_dtype=qtype)

    tensor("token_embd.weight", vocab, hidden, "token_embd")
    if not tied:
        tensor("output.weight", vocab, hidden, "output")
    w.add_tensor("output_norm.weight", (1 + rng.normal(0, 0.1, hidden)).astype(np.float32))
    sizes = {
        "attn_q": (n_heads * head_dim, hidden),
        "attn_k": (n_kv * head_dim, hidden),
        "attn_v": (n_kv * head_dim, hidden),
        "attn_output": (hidden, n_heads * head_dim),
        "ffn_gate": (inter, hidden),
        "ffn_up": (inter, hidden),
        "ffn_down": (hidden, inter),
    }
    for i in range(n_layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", (1 + rng.normal(0, 0.1, hidden)).astype(np.float32))
        for kind in GGUF_LINEARS:
            tensor(f"blk.{i}.{kind}.weight", *sizes[kind], kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rowop_session(model, path: str):
    """An ONNX Runtime session (2 threads) of an onnx model that uses the row-kernel ops, with the
    library's ISA path `path` forced (the variable is read when the session registers the library)."""
    import os

    import onnxruntime as ort

    from edgespec.engines import rowop

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    old = os.environ.get(rowop.ISA_ENV)
    os.environ[rowop.ISA_ENV] = path
    try:
        rowop.register(so)
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    finally:
        if old is None:
            del os.environ[rowop.ISA_ENV]
        else:
            os.environ[rowop.ISA_ENV] = old


# A tiny Gemma 3's config fields: layer 0 sliding with a window that prompts and prefill chunks cross,
# layer 1 full; rope bases apart, the score scale not 1/sqrt(head_dim)
GEMMA3_FIELDS = dict(
    head_dim=32,
    query_pre_attn_scalar=24,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    },
    tie_word_embeddings=True,
)


# ---- tiny drafter checkpoints for a tiny target (random, or its own init plus noise) -----------------
def _target_arrays(model_dir):
    """(ArchSpec, float32 state dict) of a tiny HF target folder."""
    from transformers import AutoModelForCausalLM

    from edgespec.export.target.arch import arch_from_config

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    arch = arch_from_config(model.config, 256)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    return arch, sd


def tiny_eagle_head(
    model_dir, out, draft_vocab: int | None = None, seed: int = 0, noise: float = 0.0, by_frequency: bool = False
):
    """A head for a tiny target, saved in the EAGLE layout (random, or a copy of the last layer)."""
    import dataclasses

    from edgespec.export.drafters.eagle.checkpoint import save_head
    from edgespec.export.drafters.eagle.head import build_head, init_arrays

    arch, sd = _target_arrays(model_dir)
    V = arch.vocab_size
    d2t = np.arange(V) if draft_vocab is None else np.sort(np.random.default_rng(seed).choice(V, draft_vocab, False))
    hc, arrays = init_arrays(arch, sd, d2t.astype(np.int64), seed)
    if by_frequency:  # as train-eagle writes them: d2t most frequent first (here: an arbitrary order)
        arrays["d2t"] = np.random.default_rng(seed).permutation(arrays["d2t"])
        hc = dataclasses.replace(hc, d2t_by_frequency=True)
    rng = np.random.default_rng(seed + 1)
    for k, v in arrays.items():
        if k != "d2t" and noise:
            arrays[k] = (v + rng.normal(0, noise, v.shape)).astype(np.float32)
    cos, sin = arch.rope_tables()
    embed = sd["model.embed_tokens.weight"]
    lm = sd.get("lm_head.weight", embed)
    head = build_head(hc, arrays, embed, lm, cos, sin)
    save_head(head, out)
    return out, head, arch


def tiny_eagle3_head(model_dir, out, draft_vocab: int = 48, seed: int = 0, noise: float = 0.02):
    """An EAGLE-3 head for a tiny target (its init plus noise), saved in the EAGLE-3 layout."""
    from edgespec.export.drafters.eagle3.head import build_eagle3, init_arrays, save_eagle3

    arch, sd = _target_arrays(model_dir)
    V = arch.vocab_size
    d2t = np.random.default_rng(seed).permutation(V)[:draft_vocab].astype(np.int64)
    embed = sd["model.embed_tokens.weight"]
    ec, arrays = init_arrays(arch, sd, sd.get("lm_head.weight", embed), d2t, seed)
    rng = np.random.default_rng(seed + 1)
    for k, v in arrays.items():
        if k != "d2t":
            arrays[k] = (v + rng.normal(0, noise, v.shape)).astype(np.float32)
    cos, sin = arch.rope_tables()
    head = build_eagle3(ec, arrays, embed, cos, sin)
    save_eagle3(head, out)
    return out, head, arch


def tiny_medusa_heads(model_dir, out, draft_vocab: int = 48, n_heads: int = 3, n_layers: int = 1, seed: int = 0):
    """Random heads for a tiny target, saved in the Medusa layout."""
    from transformers import AutoModelForCausalLM

    from edgespec.export.drafters.medusa.checkpoint import save_heads
    from edgespec.export.drafters.medusa.head import MedusaConfig, build_heads, random_heads
    from edgespec.export.target.arch import arch_from_config

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    arch = arch_from_config(model.config, 256)
    V = arch.vocab_size
    d2t = np.sort(np.random.default_rng(seed).choice(V, draft_vocab, False)) if draft_vocab < V else np.arange(V)
    mc = MedusaConfig(
        hidden_size=arch.hidden_size, vocab_size=V, draft_vocab_size=len(d2t), n_heads=n_heads, n_layers=n_layers
    )
    lm = model.lm_head.weight.detach().float().numpy()
    heads = build_heads(mc, random_heads(mc, d2t, seed), lm)
    save_heads(heads, out)
    return out, heads, arch


def tiny_dflash(model_dir, out, block_size: int = 5, draft_vocab: int = 48, seed: int = 0, noise: float = 0.02):
    """An untrained DFlash drafter for a tiny target (its init plus noise), saved in the DFlash layout."""
    from edgespec.export.drafters.dflash.model import DFlashConfig, build_dflash, init_arrays, save_dflash
    from edgespec.export.target.spec import aux_layers

    arch, sd = _target_arrays(model_dir)
    d2t = np.random.default_rng(seed).permutation(arch.vocab_size)[:draft_vocab].astype(np.int64)
    dc = DFlashConfig(
        hidden_size=arch.hidden_size,
        n_layers=1,
        n_heads=arch.n_heads,
        n_kv_heads=arch.n_kv_heads,
        head_dim=arch.head_dim,
        intermediate_size=arch.intermediate_size,
        rms_norm_eps=arch.rms_norm_eps,
        rope_theta=float(arch.rope_theta),
        vocab_size=arch.vocab_size,
        draft_vocab_size=draft_vocab,
        block_size=block_size,
        mask_token_id=arch.vocab_size - 1,
        target_layer_ids=tuple(ly - 1 for ly in aux_layers(arch.n_layers)),
        n_target_layers=arch.n_layers,
    )
    arrays = init_arrays(arch, sd, d2t, dc, seed)
    rng = np.random.default_rng(seed + 1)
    for k, v in arrays.items():
        if k != "d2t":
            arrays[k] = (v + rng.normal(0, noise, v.shape)).astype(np.float32)
    embed = sd["model.embed_tokens.weight"]
    cos, sin = arch.rope_tables()
    save_dflash(build_dflash(dc, arrays, embed, sd.get("lm_head.weight", embed), cos, sin), out)
    return out
