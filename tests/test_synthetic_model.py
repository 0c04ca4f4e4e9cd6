"""tools/synthetic_model.py: real configs' layouts with random weights, written one tensor at a time;
here on a scaled-down config (the real sizes are benchmarks, docs/results/, not CI)."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, export  # noqa: E402

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def synth():
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "tools/synthetic_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_model"] = mod  # its dataclasses look their module up while being defined
    spec.loader.exec_module(mod)
    small = dataclasses.replace(  # llama-3.1-8b's layout (untied, llama3 rope) at a test's size
        mod.CONFIGS["llama-3.1-8b"], hidden_size=256, intermediate_size=512, n_layers=8, n_heads=4, n_kv_heads=2,
        head_dim=64, vocab_size=1024,
    )  # fmt: skip
    mod.CONFIGS["tiny-8b-layout"] = small
    sizes = ("hidden_size", "intermediate_size", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size")
    qwen3 = {k: getattr(small, k) for k in sizes} | {"head_dim": 128}  # transformers' GGUF qwen3 config: 128 always
    mod.CONFIGS["tiny-qwen3"] = dataclasses.replace(mod.CONFIGS["qwen3-4b"], **qwen3)
    return mod


def _export(src, out):
    kw = dict(max_len=128, k=2, prefill_chunk=16, kv_bucket=32, trees=False, progress=False, precision="int4")
    return load_manifest(export(ExportConfig(target=str(src), out=str(out), **kw)))


@pytest.mark.parametrize("config", ["tiny-8b-layout", "tiny-qwen3"])
def test_safetensors_folder_has_the_configs_layout_and_exports(synth, config, tmp_path):
    out = tmp_path / config
    synth.main(["--config", config, "--out", str(out)])
    cfg = json.loads((out / "config.json").read_text())
    c = synth.CONFIGS[config]
    assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["tie_word_embeddings"]) == (1024, 8, c.tied)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == {name for name, _, _ in synth.tensors(c)}
    m = _export(out, tmp_path / "e")
    assert m.target.vocab_size == 1024 and m.target.n_layers == 8
    assert {o.source for o in m.target.weight_origins} == {"float"}


def test_gguf_q4_k_m_takes_llama_cpps_mix_and_its_blocks_are_kept(synth, tmp_path):
    path = tmp_path / "m.gguf"
    synth.main(["--config", "tiny-8b-layout", "--format", "gguf-q4_k_m", "--out", str(path)])
    r = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["output.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q6_K"
    assert types["blk.1.attn_v.weight"] == "Q4_K" and types["blk.0.attn_q.weight"] == "Q4_K"
    w = gguf.quants.dequantize(
        next(t for t in r.tensors if t.name == "blk.3.ffn_up.weight").data, gguf.GGMLQuantizationType.Q4_K
    )
    assert w.shape == (512, 256) and 0.01 < w.std() < 0.04
    m = _export(path, tmp_path / "e")
    assert all(o.exact for o in m.target.weight_origins), m.target.weight_origins
    # (the embedding: the untied file's float table, kept as fp16 where every value is one)
    assert {o.source for o in m.target.weight_origins if "embed" not in o.kind} == {"Q4_K", "Q6_K"}


def test_a_gguf_transformers_loads_with_other_shapes_is_refused(synth, tmp_path):
    """transformers' GGUF loader takes qwen3's head_dim from its class default, not the header: a file
    with another one does not fit the model it builds, refused in one message."""
    from edgespec.export.target.sources.resolve import SourceError

    synth.CONFIGS["odd-qwen3"] = dataclasses.replace(synth.CONFIGS["tiny-qwen3"], head_dim=64)
    path = tmp_path / "odd.gguf"
    synth.main(["--config", "odd-qwen3", "--format", "gguf-q8_0", "--out", str(path)])
    with pytest.raises(SourceError, match="shapes do not fit the config"):
        _export(path, tmp_path / "e")


def test_gguf_q8_0(synth, tmp_path):
    path = tmp_path / "q8.gguf"
    synth.main(["--config", "tiny-qwen3", "--format", "gguf-q8_0", "--out", str(path)])
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert {v for k, v in types.items() if not k.endswith("norm.weight")} == {"Q8_0"}
    m = _export(path, tmp_path / "e")
    assert m.target.arch.model_type == "qwen3" and all(o.exact for o in m.target.weight_origins)
    assert np.isfinite(max(m.target.validation.values()))
