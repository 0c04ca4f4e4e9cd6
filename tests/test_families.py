"""Model families beyond Llama/Qwen: tiny random Granite, Phi-3 and SmolLM3 models exported fp32 in
both flavours, checked against transformers (validation and greedy ids), row parity, and
speculative == plain for the n-gram, suffix and self:1 drafters."""

import pytest

pytest.importorskip("torch")

from tiny import assert_rows_bitwise_alike, make_tiny  # noqa: E402

from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.export.arch import UnsupportedModelError, arch_from_config  # noqa: E402
from edgespec.export.exporter import ExportConfig, export  # noqa: E402
from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402

# each family with the config fields that make it differ from Llama set away from their neutral value
FAMILIES = {
    "granite": dict(embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.4, logits_scaling=2.0),
    "phi3": dict(),  # fused qkv_proj and gate_up_proj in the checkpoint
    "smollm3": dict(no_rope_layers=[0, 1]),  # layer 0 (the self:1 draft) without rope, layer 1 with
    # layer 0 (the self:1 draft) sliding with a window the prompt and a prefill chunk cross, layer 1
    # full; rope bases apart, the score scale not 1/sqrt(head_dim), random norms (their 1 + w folded)
    "gemma3_text": dict(
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
        tie_word_embeddings=True,
    ),
}
PROMPT = "hello hello world, hello world again and again; hello"
N_NEW = 40


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {mt: make_tiny(mt, root / mt, **kw) for mt, kw in FAMILIES.items()}


def _hf_greedy(src, ids: list[int], n: int) -> list[int]:
    """n greedy tokens of the HF model itself (no EOS stop)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(ids) :]


def _ids(g, n, drafter, k=4):
    g.set_drafter(drafter, k) if drafter != "none" else g.set_drafter("none")
    return [int(t) for c in g.generate_ids(g.codec.encode(PROMPT), n) for t in c]


@pytest.mark.parametrize("graph", ["portable", "lean"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_exports_matches_transformers_and_keeps_the_rule(family, graph, family_models, tmp_path):
    src = family_models[family]
    folder = export(
        ExportConfig(
            target=str(src),
            out=str(tmp_path / "e"),
            draft="self:1",
            max_len=128,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            graph=graph,
            progress=False,
        )
    )
    m = load_manifest(folder)
    for role in ("target", "draft"):  # ORT vs PyTorch, per phase width
        diffs = m.models()[role].validation
        assert diffs and max(diffs.values()) < 1e-4, (role, diffs)
    assert_rows_bitwise_alike(m, f"{family}/{graph}")

    g = Generator.load(folder, RuntimeConfig(drafter="none", adaptive=False))
    plain = _ids(g, N_NEW, "none")
    assert plain, "no tokens generated"
    assert plain == _hf_greedy(src, [int(t) for t in g.codec.encode(PROMPT)], len(plain))
    for drafter in ("ngram", "suffix", "draft"):
        for k in (1, 3):
            assert _ids(g, N_NEW, drafter, k) == plain, f"{family}/{graph}: {drafter} k={k} diverged"


def test_family_specific_refusals():
    from transformers import AutoConfig

    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor=0.5"):
        arch_from_config(AutoConfig.for_model("phi3", partial_rotary_factor=0.5), 128)
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0] * 48}
    with pytest.raises(UnsupportedModelError, match="rope type 'longrope'"):
        arch_from_config(
            AutoConfig.for_model("phi3", rope_scaling=longrope, original_max_position_embeddings=4096), 128
        )
    a = arch_from_config(AutoConfig.for_model("smollm3", num_hidden_layers=8), 128)
    assert a.nope_layers == (3, 7)  # a NoPE layer every 4th (no_rope_layer_interval)
    a = arch_from_config(AutoConfig.for_model("granite", attention_multiplier=0.5, head_dim=64), 128)
    assert a.attn_scale == 0.5 and arch_from_config(AutoConfig.for_model("llama"), 128).attn_scale == pytest.approx(
        128**-0.5, rel=1e-12
    )
