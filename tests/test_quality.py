"""`edgespec quality`: folders (and GGUFs on llama.cpp) against a reference on held-out text."""

import json
import sys
import types

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

from tiny import GGUF_LINEARS, make_tiny_gguf  # noqa: E402

from edgespec.cli import main  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, export  # noqa: E402

TEXT = "def add(a, b):\n    return a + b\n\n" * 20 + "The quick brown fox jumps over the lazy dog.\n" * 10


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    src = make_tiny_gguf(root / "q.gguf", dict.fromkeys(GGUF_LINEARS, "Q4_1"))
    kw = dict(max_len=128, k=2, prefill_chunk=16, kv_bucket=32, trees=False, progress=False, target=str(src))
    out = {p: str(export(ExportConfig(out=str(root / p), precision=p, **kw))) for p in ("fp32", "int4")}
    (root / "text.txt").write_text(TEXT)
    return out | {"gguf": str(src), "text": str(root / "text.txt"), "root": root}


def test_quality_of_an_int4_folder_against_its_fp32_export(folders, capsys):
    out = folders["root"] / "q.json"
    args = [folders["int4"], "--reference", folders["fp32"], "--text", folders["text"], "--json", str(out)]
    assert main(["quality", *args, "--max-tokens", "300"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["folder"] for r in rows] == [folders["fp32"], folders["int4"]]
    assert rows[0]["top1_agreement"] == 1.0 and rows[0]["kl_to_reference"] == 0.0
    assert 0.8 < rows[1]["top1_agreement"] <= 1.0 and 0 < rows[1]["kl_to_reference"] < 0.1
    assert set(rows[1]) >= {"folder", "top1_agreement", "kl_to_reference", "perplexity"}
    assert capsys.readouterr().out.startswith("300 tokens of text.txt; reference ")


def test_a_gguf_runs_on_llama_cpp_in_the_reference_windows(folders, monkeypatch):
    """A stand-in llama_cpp whose logits are the fp32 folder's: the GGUF row must then equal the
    reference row (same ids, same windows of max_len, a fresh context per window)."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    class Llama:
        def __init__(self, model_path, n_ctx, logits_all, verbose):
            assert model_path == folders["gguf"] and n_ctx == 128 and logits_all
            m = load_manifest(folders["fp32"])
            self.engine, self.scores = OrtModel(m, m.target), None

        def n_vocab(self):
            return 256

        def reset(self):
            self.scores = None

        def eval(self, tokens):
            assert self.scores is None and len(tokens) <= 127  # one window per reset
            rows = []
            for i, t in enumerate(tokens):  # one token a call: llama.cpp's batches are its own business
                rows.append(self.engine.forward(np.array([t]), i)[:1].copy())
                self.engine.commit(i, 1)
            self.scores = np.concatenate(rows)

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=Llama))
    from pathlib import Path

    from edgespec.runtime.apps.quality import measure

    _, rows = measure([folders["gguf"]], folders["fp32"], [Path(folders["text"])], 200)
    assert rows[1].precision == "llama.cpp" and rows[1].top1_agreement == 1.0 and rows[1].kl_to_reference < 1e-6


def test_a_gguf_without_llama_cpp_is_one_line(folders, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    assert main(["quality", folders["gguf"], "--reference", folders["fp32"], "--text", folders["text"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "llama-cpp-python" in err and "--precision fp32" in err, err
