"""DFlash block drafter: checkpoint layout, training on tiny data, export (ORT vs PyTorch, run by
the export's validation), greedy identity with plain decoding, and lossless sampling."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A tiny llama of 8 layers: three distinct feature layers (2, 4, 5)."""
    from tiny import make_tiny

    return make_tiny("llama", tmp_path_factory.mktemp("df") / "llama8", num_hidden_layers=8)


@pytest.fixture(scope="module")
def tiny_drafter(tiny_target, tmp_path_factory):
    """A DFlash drafter trained for a few steps on the tiny target's own answers (with aux features)."""
    from edgespec.export.drafters.dflash.train import TrainConfig, train
    from edgespec.export.train.head_data import DataConfig, generate_data

    root = tmp_path_factory.mktemp("dfdata")
    data = generate_data(
        DataConfig(
            out=str(root / "data"),
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
    return train(
        TrainConfig(
            data=str(data),
            out=str(root / "dflash"),
            target=str(tiny_target),
            block_size=6,
            draft_vocab=64,
            anchors=6,
            minutes=0.5,
            epochs=2,
            batch_tokens=512,
        ),
        progress=False,
    )


def test_checkpoint_is_in_the_dflash_layout(tiny_drafter):
    from safetensors.numpy import load_file

    from edgespec.export.drafters.dflash.model import read_dflash

    cfg = json.loads((tiny_drafter / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["is_causal"] is False
    assert cfg["dflash_config"]["block_size"] == 6 and cfg["dflash_config"]["target_layer_ids"] == [1, 3, 4]
    w = load_file(str(tiny_drafter / "model.safetensors"))
    H = cfg["hidden_size"]
    assert w["fc.weight"].shape == (H, 3 * H)
    assert {
        "hidden_norm.weight",
        "norm.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
        "layers.0.mlp.gate_proj.weight",
        "d2t",
    } <= set(w)
    dc, arrays = read_dflash(tiny_drafter, H, 256)
    assert dc.block_size == 6 and len(arrays["d2t"]) == 64 == dc.draft_vocab_size
    assert "holdout" in cfg["edgespec"] and len(cfg["edgespec"]["holdout"]["p_first_i_right"]) == 5


def test_read_refuses_a_drafter_for_another_target(tiny_drafter):
    from edgespec.export.drafters.dflash.model import DFlashFormatError, read_dflash

    with pytest.raises(DFlashFormatError, match="hidden size 128"):
        read_dflash(tiny_drafter, 128, 256)


@pytest.fixture(scope="module")
def dflash_engine(tiny_target, tiny_drafter, tmp_path_factory):
    """An engine folder with the drafter; the export validates its graph against PyTorch."""
    from edgespec.export.target.exporter import ExportConfig, export

    out = tmp_path_factory.mktemp("dfeng") / "tiny-dflash"
    return export(
        ExportConfig(
            target=str(tiny_target),
            dflash=str(tiny_drafter),
            eagle="none",
            medusa="none",
            out=str(out),
            max_len=256,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            progress=False,
        )
    )


def test_export_validates_the_graph_against_pytorch(dflash_engine):
    from edgespec.engines.manifest import load_manifest

    m = load_manifest(dflash_engine)
    assert "dflash" in m.drafters and m.section("dflash").block_size == 6
    assert m.target.aux_layers == (2, 4, 5) and m.section("dflash").feature_width == m.target.aux_width
    val = m.models()["dflash"].validation
    assert val and max(val.values()) < 1e-3  # fp32: ORT ~ PyTorch


@pytest.mark.parametrize("drafter,k", [("dflash", 2), ("dflash", 4), ("hybrid", 4)])
def test_greedy_dflash_output_is_plain_output(dflash_engine, drafter, k):
    """dflash alone, and as hybrid's head beside suffix decoding (--hybrid-head dflash)."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    rng = np.random.default_rng(3)
    plain = Generator.load(dflash_engine, RuntimeConfig(drafter="none"))
    spec = Generator.load(
        dflash_engine, RuntimeConfig(drafter=drafter, k=k, eagle_min_confidence=0.0, hybrid_head="dflash")
    )
    drafted = 0
    for n in (5, 23, 40):
        prompt = rng.integers(2, 256, n)
        want = np.concatenate(list(plain.generate_ids(prompt, 30)))
        got = np.concatenate(list(spec.generate_ids(prompt, 30)))
        assert np.array_equal(want, got), f"prompt of {n}: {drafter} k={k} differs from plain"
        drafted += spec.last_stats.n_drafted
    assert drafted > 0


class FakeDFlash:
    """A block drafter over a small vocabulary: each block row's logits from the anchor and the
    row (a fixed table), so drafts are often but not always the target's."""

    def __init__(self, vocab: int, d2t, block_size: int = 4, max_len: int = 64) -> None:
        rng = np.random.default_rng(7)
        self.d2t = np.array(d2t, np.int64)
        self.block_size, self.max_len, self.n_calls = block_size, max_len, 0
        self.feature_width = 2 * vocab
        self.table = rng.standard_normal((vocab, block_size - 1, len(self.d2t))).astype(np.float32) * 2

    def draft(self, feats, ctx_len, anchor):
        assert feats.shape[1] == self.feature_width
        self.n_calls += 1
        return self.table[anchor]

    def load(self) -> None:
        pass


def test_dflash_sampling_keeps_the_target_distribution():
    pytest.importorskip("scipy")
    from helpers.sampling import AuxTarget, V, chi2_pvalue, exact_tokens_23, sample_counts

    from edgespec.engines.fake import random_table
    from edgespec.runtime.backends import Engines
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    table = random_table(V, seed=11, sharpness=1.0)
    # the confidence cut depends on the block's logits only: lossless either way; hybrid: its head
    for drafter, cut in (("dflash", 0.0), ("dflash", 0.3), ("hybrid", 0.0)):
        g = Generator(
            None,
            Engines(AuxTarget(table, 64), {"dflash": FakeDFlash(V, [0, 2, 3, 5, 6])}),
            RuntimeConfig(drafter=drafter, k=3, eagle_min_confidence=cut, hybrid_head="dflash"),
        )
        p = chi2_pvalue(sample_counts(g), exact_tokens_23(g))
        assert p > 1e-3, f"{drafter} (cut {cut}): chi-square p = {p:.2g}: samples do not follow the target"
        assert g.last_stats.n_drafted > 0
