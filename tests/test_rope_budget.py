"""Rotary tables computed at load (engines/rope.py) and the folder's maximum context chosen by the
export's memory budget (export/target/budget.py): no table bytes in the folder, the same table bytes
as the export's, a default context of the model's own capped by the budget, one-line refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from edgespec.engines import rope
from edgespec.engines.context import DEFAULT_CONTEXT, at_load
from edgespec.engines.manifest import load_manifest
from edgespec.export.target import budget
from edgespec.export.target.spec import ExportError


def test_the_folder_stores_no_rotary_table_and_the_engines_compute_the_exports(tiny_engine):
    m = load_manifest(tiny_engine)
    tables = {n: w for n, w in m.target.weights.items() if w.rope is not None}
    assert sorted(tables) == ["rope_cos_half", "rope_sin_half"]
    stored = [w for w in m.target.weights.values() if w.rope is None]
    size = (tiny_engine / m.target.weights_file).stat().st_size
    assert size < max(w.offset + w.nbytes for w in stored) + 64  # the weights file ends with the last stored one
    assert (tiny_engine / rope.COMPUTED_FILE).read_text() == rope.COMPUTED_NOTE
    for name, w in tables.items():
        assert w.file == rope.COMPUTED_FILE and w.shape[0] == m.max_len
        t = rope.checked_table(name, w.rope, tuple(w.shape), w.dtype)
        assert rope.crc(t) == w.rope.crc  # the export's bytes, bitwise
        full_cos, full_sin = rope.tables(m.max_len, w.rope.dim, w.rope.theta, w.rope.rope_type, w.rope.params)
        want = full_cos if w.rope.part == "cos" else full_sin
        assert np.array_equal(t, want[:, : w.rope.dim // 2])


def test_a_reader_that_is_not_the_engines_fails_loudly_on_a_computed_table(tiny_engine):
    """onnx's external-data loader reads the note file and refuses (it holds none of the bytes)."""
    m = load_manifest(tiny_engine)
    model = onnx.load(str(tiny_engine / m.target.graph.file), load_external_data=False)
    with pytest.raises(ValueError, match="rope_"):
        onnx.load_external_data_for_model(model, str(tiny_engine))


def test_the_tensorrt_parse_copy_carries_the_tables_inline(tiny_engine):
    from edgespec.export.target.trt_build import computed_inline

    m = load_manifest(tiny_engine)
    path = tiny_engine / m.target.graph.file
    with computed_inline(path, m, m.target) as parsed:
        assert parsed != path
        model = onnx.load(str(parsed), load_external_data=False)
        inits = {i.name: i for i in model.graph.initializer}
        for name, w in m.target.weights.items():
            if w.rope is not None:
                got = onnx.numpy_helper.to_array(inits[name])
                assert np.array_equal(got, rope.table(w.rope, w.shape[0], w.dtype))
    assert not parsed.exists()


def test_a_machine_whose_cosine_rounds_differently_is_told_once(capsys):
    t = rope.RopeTable("cos", 8, True, 10000.0, "default", {}, crc=0)
    rope._WARNED.discard("x")
    rope.checked_table("x", t, (16, 4), "float32")
    rope.checked_table("x", t, (16, 4), "float32")
    err = capsys.readouterr().err
    assert err.count("differs from the export's") == 1


def test_an_edited_table_shape_is_refused_before_it_is_computed(tiny_engine, tmp_path):
    import json
    import shutil

    from edgespec.engines.manifest import ManifestError

    folder = tmp_path / "f"
    shutil.copytree(tiny_engine, folder)
    d = json.loads((folder / "manifest.json").read_text())
    w = d["target"]["weights"]["rope_cos_half"]
    w["shape"][0], w["nbytes"] = 10**12, 10**12 * w["shape"][1] * 4
    (folder / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="rotary table rope_cos_half is"):
        load_manifest(folder, files=False)


def test_a_load_without_max_len_takes_the_default_context_or_the_folders_maximum(tiny_engine):
    m = load_manifest(tiny_engine)
    assert at_load(m).max_len == min(m.max_len, DEFAULT_CONTEXT)
    big = dataclasses.replace(m, max_len=4 * DEFAULT_CONTEXT)  # a folder whose maximum is above the default
    assert at_load(big).max_len == DEFAULT_CONTEXT
    assert at_load(big, 2 * DEFAULT_CONTEXT).max_len == 2 * DEFAULT_CONTEXT


# ---- the export's maximum context --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_src(tiny_models):
    from edgespec.export.target import sources

    src = sources.resolve(str(tiny_models["llama"]))
    return src, sources.target_shape(src)


def _cfg(**kw):
    from edgespec.export.target.exporter import ExportConfig

    return ExportConfig(**({"k": 4, "prefill_chunk": 16, "kv_bucket": 32, "progress": False} | kw))


def test_the_default_maximum_is_the_models_own_context_where_the_budget_holds_it(tiny_src):
    src, hf = tiny_src
    lines = []
    cfg = budget.resolve_context(_cfg(memory_budget=8.0), src, hf, lambda *a, **k: lines.append(a[0]))
    assert cfg.max_len == hf.context == 1024
    assert "context up to 1024 tokens (the model's own)" in lines[0] and "memory budget 8.0 GiB" in lines[0]


def test_a_small_budget_caps_the_default_maximum_in_whole_buckets(tiny_src):
    src, hf = tiny_src
    per_token, _ = budget.kv_bytes_per_token(_cfg(), hf)
    weights = budget.weights_estimate(_cfg(), src, hf)
    room_for = 300  # tokens of KV the budget leaves
    gib = (weights + budget.WORKING_SET + room_for * per_token) / budget.GIB
    lines = []
    cfg = budget.resolve_context(_cfg(memory_budget=gib), src, hf, lambda *a, **k: lines.append(a[0]))
    assert cfg.max_len == 288 and isinstance(cfg.max_len, int)  # 300 down to a multiple of kv_bucket 32
    assert "capped by the memory budget; the model's own is 1024" in lines[0]


def test_a_budget_the_model_cannot_fit_and_a_max_len_above_it_are_refused_in_one_line(tiny_src):
    src, hf = tiny_src
    with pytest.raises(ExportError, match=r"cannot hold .* Hint: raise --memory-budget") as e:
        budget.resolve_context(_cfg(memory_budget=0.5), src, hf)
    assert "\n" not in str(e.value)
    with pytest.raises(ExportError, match=r"--max-len 1024 does not fit --memory-budget .* Hint: give --max-len"):
        per_token, _ = budget.kv_bytes_per_token(_cfg(), hf)
        weights = budget.weights_estimate(_cfg(), src, hf)
        gib = (weights + budget.WORKING_SET + 100 * per_token) / budget.GIB
        budget.resolve_context(_cfg(memory_budget=gib, max_len=1024), src, hf)
    assert budget.resolve_context(_cfg(max_len=512), src, hf).max_len == 512  # no budget given: as asked


def test_the_export_refuses_a_budget_before_reading_a_weight(tiny_models, tmp_path, capsys):
    from edgespec.cli import main

    rc = main(["export", "--target", str(tiny_models["llama"]), "--out", str(tmp_path / "o"), "--memory-budget", "0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "cannot hold" in err[-1] and not (tmp_path / "o").exists()
