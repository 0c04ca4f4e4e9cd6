"""`--precision auto` times its candidates on a sampled model (the first probe.DEPTH layers, the
whole vocabulary) and exports the winner once; the recorded width table is the whole model's cost,
extrapolated by the per-layer slope of a one-layer graph and a DEPTH-layer graph on the same
weights. A target that does not stream has its candidates exported whole, as before."""

import tempfile
from pathlib import Path

import numpy as np
import pytest
from tiny import make_tiny

from edgespec.engines.manifest import load_manifest
from edgespec.export.target.checks import probe, probe_costs
from edgespec.export.target.exporter import ExportConfig, export
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator

AUTO = dict(max_len=128, k=2, prefill_chunk=16, kv_bucket=32, precision="auto", progress=False, validate=False)


def test_whole_model_costs_scale_the_layer_slope_and_the_sampled_head():
    by_depth = {1: {1: 3.0, 2: 4.0}, 2: {1: 4.0, 2: 5.5}}  # a layer: 1.0 at T=1, 1.5 at T=2; the rest 2.0, 2.5
    assert probe_costs.whole_model_costs(by_depth, 16) == {1: 16 * 1.0 + 2.0, 2: 16 * 1.5 + 2.5}
    assert probe_costs.whole_model_costs(by_depth, 16, vocab_scale=4.0) == {1: 16 * 1.0 + 8.0, 2: 16 * 1.5 + 10.0}
    assert probe_costs.whole_model_costs({2: {1: 4.0}}, 2) == {1: 4.0}  # the model itself


def test_paired_costs_take_the_median_round_and_never_fall_below_the_deepest_graph():
    # round 2 ran under a burst of load that hit both graphs: its pair still says a layer costs 1.0
    by_depth = {1: {1: [3.0, 9.0, 3.1]}, 2: {1: [4.0, 10.0, 4.1]}}
    assert probe_costs.paired_whole_model_costs(by_depth, 16) == {1: pytest.approx(16 * 1.0 + 2.1)}  # 18.0, 24.0, 18.1
    noise = {1: {1: [3.0, 3.0, 3.0]}, 2: {1: [2.5, 2.6, 2.7]}}  # the deeper graph timed faster: no negative layers
    assert probe_costs.paired_whole_model_costs(noise, 16) == {1: 2.6}


def test_sampled_rows_cut_big_heads_only():
    assert probe.sampled_rows(49152, 576, 30) is None  # SmolLM2's head is small: every row
    rows = probe.sampled_rows(128256, 2048, 16)  # Llama 3.2 1B: a quarter, spread over the vocabulary
    assert len(rows) == probe.HEAD_WEIGHTS // 2048 and rows[0] == 0 and rows[-1] >= 128256 - 4
    assert (rows[1:] > rows[:-1]).all()
    assert probe.sampled_rows(128256, 2048, 1) is None  # one layer: nothing to tell the head from


def test_auto_times_a_sampled_prefix_and_exports_the_winner_once(tmp_path, monkeypatch, capsys):
    src = make_tiny("llama", tmp_path / "deep", num_hidden_layers=4)
    monkeypatch.setattr(probe, "HEAD_WEIGHTS", 64 * 64)  # 64 of the 256 vocabulary rows (hidden 64)
    monkeypatch.setattr(probe, "WHOLE_BELOW", 0)  # (a tiny model: sampled as a large one would be)
    exports = []
    real_export = export

    def counted(cfg):
        exports.append(cfg.precision)
        return real_export(cfg)

    monkeypatch.setattr("edgespec.export.target.exporter.export", counted)
    before = set(Path(tempfile.gettempdir()).glob("edgespec-probe-*"))
    out = counted(ExportConfig(target=str(src), out=str(tmp_path / "e"), **AUTO | {"progress": True}))
    assert len(exports) == 1 and exports[0] == "auto"  # no candidate exported whole
    m = load_manifest(out)
    p = m.export_probe
    assert p["method"] == "sampled" and p["chosen"].split("-")[0] == m.target.precision
    s = p["sampled"]
    assert (s["layers"], s["of_layers"], s["vocab_rows"], s["of_vocab"]) == (2, 4, 64, 256)
    assert probe_costs.MIN_ROUNDS <= s["rounds"] <= probe_costs.ROUNDS
    for name, by_layers in s["ms_by_layers"].items():  # the recorded table: measured prefixes, extrapolated
        assert set(by_layers) == {"1", "2"}
        two = by_layers["2"]
        for w in ("1", "2", "3"):  # the median round's estimate, or the 2-layer graph's median
            assert p["ms_by_width"][name][w] >= two[w] - 1e-3
    err = capsys.readouterr().err
    assert "graphs of its first 1 and 2 of 4 layers, 64 of 256 vocabulary rows, scaled to the whole model" in err
    assert set(Path(tempfile.gettempdir()).glob("edgespec-probe-*")) <= before  # its scratch folders removed
    # the generator's cost table in decodes reads the chosen candidate's row
    g = Generator.load(out, RuntimeConfig(drafter="ngram", k=2, adaptive=True))
    costs = g._recorded_costs()
    chosen = p["ms_by_width"][p["chosen"]]
    slope, at_zero = np.polyfit([int(w) for w in chosen], list(chosen.values()), 1)  # the table's line
    if slope > 0:
        assert costs[1] == 1.0 and costs[3] == pytest.approx(1 + 2 * slope / (at_zero + slope))
    else:
        assert costs is None  # a table that does not rise prices rows at ROW_COST


def test_a_target_that_does_not_stream_has_its_candidates_exported_whole(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "WHOLE_BELOW", 0)  # (a tiny model: sampled as a large one would be)
    out = export(ExportConfig(target=str(tiny_models["llama"]), out=str(tmp_path / "e"), stream_weights="off", **AUTO))
    p = load_manifest(out).export_probe
    assert p["method"] == "whole" and p["why_not_sampled"] == "--stream-weights off"
    assert {"int4", "int8"} <= set(p["ms_by_width"]) and "sampled" not in p


def test_a_small_checkpoint_is_timed_whole(tmp_path, monkeypatch):
    """Below WHOLE_BELOW bytes the candidates are exported whole (a sampled model's layer is too cheap to
    time against its LM head there): the record says so."""
    src = make_tiny("llama", tmp_path / "small")
    cfg = ExportConfig(target=str(src), out=str(tmp_path / "e"), max_len=64, k=2, precision="auto", progress=False)
    monkeypatch.setattr(probe, "_sampled_costs", lambda *a: pytest.fail("a small model was sampled"))
    _, record = probe.choose_precision(cfg, progress=False)
    assert record.get("method") == "whole" and record.get("why_not_sampled") == "a small model: timed whole"


def test_a_quantized_gguf_is_not_re_quantized_to_int8_by_the_default(tmp_path):
    """--precision auto on a GGUF whose layers are quantized blocks: the int4 candidates keep them, int8
    would re-quantize them (less faithful, 2-3x the bytes), so it is no candidate; a float GGUF keeps it."""
    from tiny import GGUF_LINEARS, make_tiny_gguf

    quant = make_tiny_gguf(tmp_path / "q.gguf", dict.fromkeys(GGUF_LINEARS, "Q4_K"))
    floats = make_tiny_gguf(tmp_path / "f.gguf", dict.fromkeys(GGUF_LINEARS, "F16"))
    assert "int8" not in probe.candidates(ExportConfig(target=str(quant), precision="auto"))[0]
    assert "int8" in probe.candidates(ExportConfig(target=str(quant), precision="auto", gguf_blocks="requantize"))[0]
    assert "int8" in probe.candidates(ExportConfig(target=str(floats), precision="auto"))[0]


def test_a_width_table_that_falls_is_flagged(monkeypatch, capsys):
    """A probe timed on a busy machine can record wider calls as cheaper (a folder of 2026-12-07: T=1
    14.0 ms, T=7 10.2 ms); the export says so in one line and the manifest records it."""
    from types import SimpleNamespace

    cands = {"int4": {"precision": "int4", "int4_kernel": "nbits"}, "int8": {"precision": "int8", "int4_kernel": ""}}
    monkeypatch.setattr(probe, "candidates", lambda cfg: (cands, "not built here"))
    monkeypatch.setattr(probe, "_source_bytes", lambda cfg: 0)
    falling, rising = {1: 0.014, 2: 0.012, 3: 0.0102}, {1: 0.010, 2: 0.011, 3: 0.012}
    monkeypatch.setattr(probe, "_whole_costs", lambda *a: ({"int4": falling, "int8": rising}, {"why": "test"}))
    _, record = probe.choose_precision(SimpleNamespace(k=2), progress=False)
    assert record["width_table_falls"] == ["int4"]
    err = capsys.readouterr().err
    assert "width table of int4 falls with width" in err and "re-export on a quiet machine" in err
    assert err.count("\n") == 1


def test_each_engine_is_timed_after_a_rest_and_an_untimed_call(monkeypatch):
    """The engine timed before leaves its ORT pool threads spinning for a while, on 2 cores enough to
    scramble the next engine's width table: every engine's widths come after a rest and a warm call."""
    log = []

    class Engine:
        def __init__(self, name):
            self.name = name

        def forward(self, ids, past, logits=True):
            log.append((self.name, len(ids)))

    monkeypatch.setattr(probe_costs.time, "sleep", lambda s: log.append(("rest", s)))
    times = probe_costs.time_widths({"a": Engine("a"), "b": Engine("b")}, [1, 3], 8)
    assert all(len(v) == probe_costs.ROUNDS for t in times.values() for v in t.values())
    per_engine = [log[i : i + 4] for i in range(0, len(log), 4)]  # rest, warm call, the widths
    for chunk, name in zip(per_engine, ["a", "b"] * (probe_costs.ROUNDS + 1), strict=True):
        assert chunk == [("rest", probe_costs.SWITCH_REST_S), (name, 1), (name, 1), (name, 3)]
