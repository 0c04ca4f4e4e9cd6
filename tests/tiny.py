"""Tiny random Llama-family models (HF folders with a char-level tokenizer) for fast tests."""

from __future__ import annotations

from pathlib import Path

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
    import numpy as np

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
