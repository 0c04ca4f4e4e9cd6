"""EAGLE-3 head: checkpoint layout, training on tiny data, export (ORT vs PyTorch), drafter eagle3 lossless."""

import json

import numpy as np
import pytest

from edgespec.runtime.drafters import shipped

torch = pytest.importorskip("torch")

from helpers.sampling import AuxTarget  # noqa: E402
from tiny import tiny_eagle3_head  # noqa: E402

from edgespec.export.drafters.eagle3.head import (  # noqa: E402
    Eagle3FormatError,
    build_eagle3,
    is_eagle3_folder,
    read_eagle3,
)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A tiny llama of 6 layers: three distinct EAGLE-3 feature layers (2, 3, 3 -> 2 blocks would
    hide a block-order bug; 8 layers: 2, 4, 5)."""
    from tiny import make_tiny

    return make_tiny("llama", tmp_path_factory.mktemp("e3") / "llama8", num_hidden_layers=8)


@pytest.fixture(scope="module")
def tiny_data(tiny_target, tmp_path_factory):
    """Self-distillation data with aux features from the tiny target's own answers."""
    from edgespec.export.train.head_data import DataConfig, generate_data

    out = tmp_path_factory.mktemp("e3data") / "data"
    return generate_data(
        DataConfig(
            out=str(out),
            target=str(tiny_target),
            n_general=12,
            n_code_chat=6,
            n_completion=6,
            max_new_tokens=24,
            batch=12,
            aux=True,
        ),
        progress=False,
    )


def test_checkpoint_layout_round_trip(tiny_target, tmp_path):
    from safetensors.numpy import load_file

    folder, head, arch = tiny_eagle3_head(tiny_target, tmp_path / "head")
    w = load_file(str(folder / "model.safetensors"))
    H = arch.hidden_size
    assert w["fc.weight"].shape == (H, 3 * H)
    assert w["midlayer.self_attn.q_proj.weight"].shape == (arch.n_heads * arch.head_dim, 2 * H)
    assert w["lm_head.weight"].shape == (48, H) and w["t2d"].dtype == bool and w["t2d"].sum() == 48
    assert {"midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "norm.weight", "d2t"} <= set(w)
    assert np.array_equal(w["d2t"] + np.arange(48), head.d2t.numpy())  # EAGLE-3: target = i + d2t[i]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 48
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert is_eagle3_folder(folder)
    ec, arrays, _ = read_eagle3(folder, H, arch.vocab_size, arch.n_layers)
    assert ec == head.cfg
    assert np.array_equal(arrays["d2t"], head.d2t.numpy())
    np.testing.assert_allclose(arrays["lm_head.weight"], head.lm_head.detach().numpy(), atol=2e-3)  # fp16
    with pytest.raises(Eagle3FormatError, match="hidden size"):
        read_eagle3(folder, H * 2, arch.vocab_size)
    with pytest.raises(Eagle3FormatError, match="layers"):
        read_eagle3(folder, H, arch.vocab_size, n_layers=30)


def test_unrolled_step_equals_a_step_on_its_own_output(tiny_target, tmp_path):
    """Training-time test: step 2 of row j equals running the head on the chain (true rows 0..j,
    then the pair (own output, token_{j+2})) as drafting does."""
    _, head, arch = tiny_eagle3_head(tiny_target, tmp_path / "h")
    g = torch.Generator().manual_seed(0)
    L, H = 7, arch.hidden_size
    tokens = torch.randint(0, arch.vocab_size, (1, L), generator=g)
    aux = torch.randn(1, L, 3 * H, generator=g)
    pos = torch.arange(L)[None]
    valid = torch.ones(1, L, dtype=torch.bool)
    with torch.no_grad():
        outs = head(tokens, aux, pos, valid, 3)
        j = 3  # the chain after row j: rows 0..j true, then steps 2 and 3 as their own rows
        hid = head.fc(aux[:, : j + 1])
        h2 = outs[0][:, j : j + 1]
        chain_tok = torch.cat([tokens[:, : j + 1], tokens[:, j + 1 : j + 3]], dim=1)
        for s in (1, 2):
            seq_h = torch.cat([hid, h2], dim=1)
            q, k, v = head.qkv(chain_tok[:, : j + 1 + s], seq_h, torch.arange(j + 1 + s)[None])
            ctx = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), head._expand(k), head._expand(v), is_causal=True
            )
            out = head.finish(seq_h, ctx.transpose(1, 2).reshape(1, j + 1 + s, -1))[:, -1:]
            torch.testing.assert_close(out, outs[s][:, j : j + 1], atol=1e-4, rtol=1e-4)
            h2 = torch.cat([h2, out], dim=1)


def test_train_eagle3_cli_end_to_end(tiny_target, tiny_data, tmp_path):
    """A short training run on tiny data, a resumed run, the held-out estimate in config.json."""
    from edgespec.cli import main

    head = tmp_path / "head"
    args = [
        "train-eagle3",
        "--target",
        str(tiny_target),
        "--data",
        str(tiny_data),
        "--out",
        str(head),
        "--minutes",
        "0.3",
        "--draft-vocab",
        "64",
    ]
    assert main(args + ["--epochs", "1"]) == 0
    step1 = torch.load(head / "checkpoint.pt", weights_only=False)["step"]
    assert main(args + ["--epochs", "2"]) == 0
    assert torch.load(head / "checkpoint.pt", weights_only=False)["step"] > step1
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64 and cfg["eagle3"]["d2t_order"] == "frequency"
    est = cfg["eagle3"]["holdout"]
    assert {"top1_step1", "top1_step2", "top1_step3", "expected_accepted"} <= set(est)
    ec, arrays, _ = read_eagle3(head, 64, 256, 8)
    assert ec.d2t_by_frequency and len(arrays["d2t"]) == 64
    # the target it was trained for, recorded: export-drafter's speculators verifier when none is named
    from pathlib import Path

    assert cfg["eagle3"]["target"] == str(Path(tiny_target).resolve())
    assert main(["export-drafter", str(head), "--format", "speculators", "--out", str(tmp_path / "spec")]) == 0
    verifier = json.loads((tmp_path / "spec" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == str(Path(tiny_target).resolve())


@pytest.fixture(scope="module")
def eagle3_engine(tiny_target, tmp_path_factory):
    """An engine folder: the tiny target (with hidden_aux) + an EAGLE-3 head, trees on."""
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("e3engine")
    head_dir, _, _ = tiny_eagle3_head(tiny_target, root / "head", noise=0.05)
    return export(
        ExportConfig(
            target=str(tiny_target),
            eagle="none",
            medusa="none",
            eagle3=str(head_dir),
            out=str(root / "engine"),
            max_len=256,
            k=6,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
        )
    )


def test_export_lists_and_validates_the_head(eagle3_engine):
    """ORT head (fed fc(hidden_aux) as the runtime feeds it) vs the PyTorch head at every width."""
    from edgespec.engines.manifest import load_manifest

    m = load_manifest(eagle3_engine)
    e = m.models().get("eagle3")
    assert e is not None and e.kind == "eagle3" and e.vocab_size == 48 and "eagle3" in m.drafters
    assert m.target.aux_layers == e.aux_layers == (2, 4, 5)  # --eagle3-features turned on by the head
    assert m.section("eagle3").fc.shape == (3 * m.target.hidden_size, m.target.hidden_size)
    assert e.weights["embed"].file == "target.weights"  # the target's table, not a copy
    assert {"prefill_t16", "decode_t1", "verify_t2"} <= set(e.validation)
    assert max(e.validation.values()) < 2e-3, e.validation


def test_portable_graph_matches_pytorch(tiny_target, tmp_path):
    """The portable flavour (TensorRT's) and int4 weights: validated at export, greedy lossless."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.export.target.exporter import ExportConfig, export
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    head_dir, _, _ = tiny_eagle3_head(tiny_target, tmp_path / "head", noise=0.05)
    out = export(
        ExportConfig(
            target=str(tiny_target),
            eagle=str(head_dir),
            medusa="none",
            out=str(tmp_path / "e"),
            max_len=128,
            k=3,
            prefill_chunk=16,
            kv_bucket=32,
            precision="int4",
            graph="portable",
            trees=False,
            progress=False,
        )
    )  # (an EAGLE-3 folder given to --eagle)
    m = load_manifest(out)
    assert m.models().get("eagle") is None and m.models()["eagle3"].graph.flavour == "portable"
    g = Generator.load(out, RuntimeConfig(drafter="none", adaptive=False, eagle_min_confidence=0.0))
    prompt = np.arange(40, 70)
    ref = np.concatenate([x.copy() for x in g.generate_ids(prompt, 30)])
    g.set_drafter("eagle3", 3)
    assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 30)]), ref)


def test_eagle3_greedy_identical_to_plain(eagle3_engine):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    g = Generator.load(eagle3_engine, RuntimeConfig(drafter="none", k=1, adaptive=False, eagle_min_confidence=0.0))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 60, n) for n in (5, 23, 40)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 48)]) for p in prompts]
    for k in (1, 3, 6):
        g.set_drafter("eagle3", k)
        for p, ref in zip(prompts, plain, strict=True):
            assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(p, 48)]), ref), (k, p)
        assert g.last_stats.n_drafted > 0
    t = Generator.load(
        eagle3_engine,
        RuntimeConfig(
            drafter="eagle3",
            k=6,
            adaptive=False,
            eagle_min_confidence=0.0,
            tree=TreeConfig(nodes=7, depth=3, branch=2, beam=2),
        ),
    )
    for p, ref in zip(prompts, plain, strict=True):
        assert np.array_equal(np.concatenate([x.copy() for x in t.generate_ids(p, 48)]), ref), ("tree", p)
    assert t.last_stats.n_drafted > t.last_stats.n_target_calls


def test_runtime_drafts_what_the_trained_module_drafts(eagle3_engine, tiny_target):
    """The runtime's chain (fc of the target graph's hidden_aux, then the head's own outputs) is
    the training forward's unrolled chain: same pairing of features, tokens and positions."""
    from transformers import AutoModelForCausalLM

    from edgespec.engines.manifest import load_manifest
    from edgespec.export.target.arch import arch_from_config
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.sampling import SamplingConfig
    from edgespec.runtime.state import SeqState

    m = load_manifest(eagle3_engine)
    g = Generator.load(eagle3_engine, RuntimeConfig(drafter="eagle3", k=3, adaptive=False, eagle_min_confidence=0.0))
    prompt = np.random.default_rng(7).integers(3, 200, 21)
    seq = SeqState(tokens=np.zeros(300, np.int64), n=len(prompt), n_prompt=len(prompt), tgt_past=0)
    g.drafter.configure(SamplingConfig(), np.random.default_rng(0))
    g._prefill(seq, prompt, SamplingConfig(), np.random.default_rng(0))
    drafts = g.drafter.propose(seq, 3).tokens[1:].copy()

    model = AutoModelForCausalLM.from_pretrained(tiny_target)
    arch = arch_from_config(model.config, 256)
    ec, arrays, _ = read_eagle3(m.models().get("eagle3").head.source, arch.hidden_size, arch.vocab_size, arch.n_layers)
    cos, sin = arch.rope_tables()
    head = build_eagle3(ec, arrays, model.model.embed_tokens.weight.detach().float().numpy(), cos, sin)
    n = seq.n  # tokens[n-1] is pending: rows j = 0..n-2 are the verified pairs
    with torch.no_grad():
        hs = model(torch.from_numpy(seq.tokens[: n - 1][None]), output_hidden_states=True).hidden_states
        aux = torch.cat([hs[layer][0] for layer in ec.aux_layers], dim=-1)
        aux = torch.cat([aux, torch.zeros(2, aux.shape[1])])[None]  # rows for the chain's steps (not valid)
        tok = torch.from_numpy(np.concatenate([seq.tokens[1:n], [0, 0]]))[None]
        pos, valid = torch.arange(n + 1)[None], torch.arange(n + 1)[None] < n - 1
        want = []
        for s in range(3):
            out = head(tok, aux, pos, valid, 3)[s][0, n - 2]
            want.append(int(head.d2t[head.logits(out).argmax()]))
            if s < 2:  # the next step's input token
                tok[0, n - 1 + s] = want[-1]
    assert drafts.tolist() == want


def test_eagle3_features_survive_prefix_reuse_and_drafter_switch(eagle3_engine):
    """The hidden_aux buffer is kept by prefill and every verify whatever the drafter."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(eagle3_engine, RuntimeConfig(drafter="none", k=4, adaptive=False, eagle_min_confidence=0.0))
    a = np.arange(3, 40)
    b = np.concatenate([a, np.arange(40, 50)])
    ref = np.concatenate([x.copy() for x in g.generate_ids(b, 30)])
    list(g.generate_ids(a, 10))
    g.set_drafter("eagle3", 4)
    out = np.concatenate([x.copy() for x in g.generate_ids(b, 30)])
    assert g.last_stats.n_prompt_cached > 0
    assert np.array_equal(out, ref)


def test_drafter_eagle3_needs_the_head(tiny_target, tmp_path):
    from edgespec.export.target.exporter import ExportConfig, ExportError, export
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    common = dict(
        target=str(tiny_target),
        medusa="none",
        max_len=64,
        k=2,
        prefill_chunk=16,
        kv_bucket=32,
        precision="fp32",
        progress=False,
    )
    out = export(ExportConfig(eagle="none", out=str(tmp_path / "plain"), **common))
    with pytest.raises(ValueError, match="--eagle3-head"):
        Generator.load(out, RuntimeConfig(drafter="eagle3"))
    with pytest.raises(ExportError, match="not a folder"):
        export(ExportConfig(eagle3=str(tmp_path / "missing"), out=str(tmp_path / "x"), **common))


def test_eagle3_sampling_keeps_the_target_distribution():
    """Chains and trees under sampling: chi-square of the 2nd and 3rd tokens against the exact
    target distribution (as the other drafters' tests in test_sampling.py)."""
    pytest.importorskip("scipy")
    from helpers.sampling import TREE, V, chi2_pvalue, exact_tokens_23, sample_counts

    from edgespec.engines.fake import FakeEagleHead, random_table
    from edgespec.runtime.backends import Engines
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    table = random_table(V, seed=11, sharpness=1.0)
    for tree in (TreeConfig(), TREE):
        head = FakeEagleHead(V, d2t=[0, 2, 3, 5, 6], max_len=64)
        head.fc_t = np.random.default_rng(4).standard_normal((2 * V, V)).astype(np.float32) * 0.5
        g = Generator(
            None,
            Engines(AuxTarget(table, 64), {"eagle3": head}),
            RuntimeConfig(drafter="eagle3", k=3, tree=tree, eagle_min_confidence=0.0),
        )
        p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
        assert p > 1e-3, f"eagle3 {tree}: chi-square p = {p:.2g}: samples do not follow the target"
        assert g.last_stats.n_drafted > 0


def test_one_folder_holds_both_heads(tiny_target, tmp_path):
    """EAGLE and EAGLE-3 heads side by side (the comparison setup): each drafter lossless, and a
    switch between them mid-conversation finds its features current (the fused eagle verify keeps
    the hidden_aux rows too)."""
    from tiny import tiny_eagle_head

    from edgespec.export.target.exporter import ExportConfig, export
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    e1, _, _ = tiny_eagle_head(tiny_target, tmp_path / "e1", draft_vocab=48, noise=0.01)
    e3, _, _ = tiny_eagle3_head(tiny_target, tmp_path / "e3", noise=0.05)
    out = export(
        ExportConfig(
            target=str(tiny_target),
            eagle=str(e1),
            eagle3=str(e3),
            medusa="none",
            out=str(tmp_path / "engine"),
            max_len=256,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            progress=False,
        )
    )
    g = Generator.load(out, RuntimeConfig(drafter="none", adaptive=False, eagle_min_confidence=0.0))
    assert {"eagle", "hybrid", "eagle3"} <= set(shipped(g.manifest, g.cfg))
    assert g.manifest.models().get("eagle_fused") is not None
    a = np.arange(3, 40)
    b = np.concatenate([a, np.arange(40, 50)])
    ref = np.concatenate([x.copy() for x in g.generate_ids(b, 30)])
    for first, second in (("eagle", "eagle3"), ("eagle3", "eagle"), ("hybrid", "eagle3")):
        g.set_drafter(first, 4)
        list(g.generate_ids(a, 10))
        g.set_drafter(second, 4)
        assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(b, 30)]), ref), (first, second)
        assert g.last_stats.n_prompt_cached > 0


def test_projection_model_is_a_matmul():
    """OrtProjection's serialized model is exactly MatMul(x [R, K], w [K, N]); it computes x @ w."""
    from onnx import TensorProto, helper

    from edgespec.engines.projection import OrtProjection

    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "projection",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", "K"]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, ["K", "N"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", "N"])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgespec")
    m.ir_version = 8
    assert m.SerializeToString() == OrtProjection.MODEL
    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, 5)).astype(np.float32)
    x = rng.standard_normal((7, 12)).astype(np.float32)
    out = np.zeros((9, 5), np.float32)
    OrtProjection(w)(x[2:5], out[1:4])
    assert np.allclose(out[1:4], x[2:5] @ w, atol=1e-5) and not out[0].any() and not out[4:].any()
