"""Medusa heads: checkpoint layout, export (ORT vs PyTorch), drafter medusa lossless (chains, trees)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny import tiny_medusa_heads  # noqa: E402

from edgespec.export.drafters.medusa.checkpoint import MedusaFormatError, read_heads  # noqa: E402


def test_checkpoint_layout_round_trip(tiny_models, tmp_path):
    from safetensors.numpy import load_file

    folder, heads, arch = tiny_medusa_heads(tiny_models["llama"], tmp_path / "heads", draft_vocab=40, n_layers=2)
    names = set(load_file(str(folder / "model.safetensors")))
    assert {"0.0.linear.weight", "0.0.linear.bias", "2.1.linear.weight", "d2t"} <= names
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 2 and cfg["draft_vocab_size"] == 40
    mc, arrays = read_heads(folder, arch.hidden_size, arch.vocab_size)
    assert np.array_equal(arrays["d2t"], heads.d2t.numpy())
    np.testing.assert_allclose(arrays["1.1.linear.weight"], heads.blocks[1][1].weight.detach().numpy(), atol=1e-3)
    with pytest.raises(MedusaFormatError, match="hidden size"):
        read_heads(folder, arch.hidden_size * 2, arch.vocab_size)
    with pytest.raises(MedusaFormatError, match="vocab"):
        read_heads(folder, arch.hidden_size, arch.vocab_size + 1)
    (folder / "config.json").write_text(json.dumps({"hidden_size": arch.hidden_size}))
    with pytest.raises(MedusaFormatError, match="medusa_num_heads"):
        read_heads(folder, arch.hidden_size, arch.vocab_size)


def test_heads_with_their_own_lm_heads_are_refused(tiny_models, tmp_path):
    """Medusa's published heads carry a full LM head each ({i}.{n_layers}.weight): said by name."""
    from safetensors.numpy import save_file

    H, V = 16, 64
    folder = tmp_path / "medusa1"
    folder.mkdir()
    save_file(
        {
            "0.0.linear.weight": np.zeros((H, H), np.float32),
            "0.0.linear.bias": np.zeros(H, np.float32),
            "0.1.weight": np.zeros((V, H), np.float32),
        },
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(
        json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1, "hidden_size": H, "vocab_size": V})
    )
    with pytest.raises(MedusaFormatError, match="own LM heads"):
        read_heads(folder, H, V)


@pytest.fixture(scope="module")
def medusa_engine(tiny_models, tmp_path_factory):
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("medusa")
    heads_dir, _, _ = tiny_medusa_heads(tiny_models["llama"], root / "heads", n_heads=4, n_layers=2)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            eagle="none",
            medusa=str(heads_dir),
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


def test_export_lists_and_validates_the_heads(medusa_engine):
    from edgespec.engines.manifest import load_manifest

    m = load_manifest(medusa_engine)
    heads = m.models()["medusa"]
    assert heads.n_heads == 4 and heads.vocab_size == 48
    assert "medusa" in m.drafters and m.models().get("eagle") is None
    assert m.models().get("medusa").validation["heads"] < 2e-3  # ORT heads vs PyTorch heads, fp32


def test_medusa_greedy_identical_to_plain_chains_and_trees(medusa_engine):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    g = Generator.load(medusa_engine, RuntimeConfig(drafter="none", k=1, adaptive=False, medusa_min_confidence=0.0))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 60, n) for n in (5, 40, 110)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 48)]) for p in prompts]
    for k in (1, 4, 6):  # k=6 > 4 heads: chains of at most 4
        g.set_drafter("medusa", k)
        for p, ref in zip(prompts, plain, strict=True):
            assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(p, 48)]), ref), (k, p)
        assert 0 < g.last_stats.n_drafted <= 4 * g.last_stats.n_target_calls
    for tree in (TreeConfig(nodes=7, depth=3, branch=2, beam=2), TreeConfig(nodes=6, depth=6, branch=3, beam=1)):
        t = Generator.load(medusa_engine, RuntimeConfig(drafter="medusa", k=6, adaptive=False, tree=tree))
        for p, ref in zip(prompts, plain, strict=True):
            assert np.array_equal(np.concatenate([x.copy() for x in t.generate_ids(p, 48)]), ref), (tree, p)
        assert t.last_stats.n_drafted > t.last_stats.n_target_calls  # trees: several candidates per call


def test_medusa_cut_off_shortens_chains_and_a_folder_without_heads_says_so(medusa_engine, tiny_engine):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    prompt = np.arange(3, 30)
    drafted = {}
    for conf in (0.0, 0.5):
        g = Generator.load(
            medusa_engine, RuntimeConfig(drafter="none", k=4, adaptive=False, medusa_min_confidence=conf)
        )
        ref = np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)])
        g.set_drafter("medusa", 4)
        assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)]), ref)
        drafted[conf] = g.last_stats.n_drafted
    assert drafted[0.5] < drafted[0.0]
    g = Generator.load(tiny_engine, RuntimeConfig(drafter="none"))
    with pytest.raises(ValueError, match="--medusa HEADS_DIR"):
        g.set_drafter("medusa", 3)


def test_train_medusa_recipe_end_to_end(tiny_models, tmp_path):
    """The documented recipe on a tiny target: data from its own answers, a short training run, a
    resumed run (the checkpoint continues), export int4 with the heads: output identical to plain."""
    from edgespec.cli import main
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    heads = tmp_path / "heads"
    args = [
        "train-medusa",
        "--target",
        str(tiny_models["llama"]),
        "--out",
        str(heads),
        "--prompts",
        "24",
        "--minutes",
        "0.5",
        "--draft-vocab",
        "64",
        "--heads",
        "3",
    ]
    assert main(args + ["--epochs", "1"]) == 0
    assert (heads / "data" / "done").exists() and (heads / "checkpoint.pt").exists()
    step1 = torch.load(heads / "checkpoint.pt", weights_only=False)["step"]
    assert main(args + ["--epochs", "3"]) == 0
    assert torch.load(heads / "checkpoint.pt", weights_only=False)["step"] > step1
    cfg = json.loads((heads / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and len(cfg["medusa"]["holdout"]["top1"]) == 3
    # --init: a fine-tune starts from those heads (their sizes and draft vocabulary, not the defaults)
    from edgespec.export.drafters.medusa.checkpoint import read_heads

    tuned = tmp_path / "tuned"
    common = ["--target", str(tiny_models["llama"]), "--data", str(heads / "data"), "--minutes", "0.5"]
    common += ["--epochs", "0.1", "--lr", "1e-9"]
    assert main(["train-medusa", "--out", str(tuned), "--init", str(heads)] + common) == 0
    (_, before), (mc, after) = read_heads(heads, 64, 256), read_heads(tuned, 64, 256)
    assert mc.n_heads == 3 and np.array_equal(before["d2t"], after["d2t"])
    assert np.allclose(before["2.0.linear.weight"], after["2.0.linear.weight"], atol=1e-3)
    assert json.loads((tuned / "config.json").read_text())["medusa"]["init"] == str(heads)
    out = tmp_path / "engine"
    assert (
        main(
            [
                "export",
                "--target",
                str(tiny_models["llama"]),
                "--eagle",
                "none",
                "--medusa",
                str(heads),
                "--out",
                str(out),
                "--max-len",
                "256",
                "--k",
                "4",
                "--prefill-chunk",
                "16",
                "--kv-bucket",
                "32",
                "--precision",
                "int4",
            ]
        )
        == 0
    )
    # tiny heads are never sure: no cut-off
    g = Generator.load(out, RuntimeConfig(drafter="none", adaptive=False, medusa_min_confidence=0.0))
    prompt = np.arange(40, 70)
    ref = np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)])
    g.set_drafter("medusa", 3)
    assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)]), ref)
    assert g.last_stats.n_drafted > 0
