"""The integer target flavour (precision int8): int8 weights x int8 activation rows with exact
int32 sums. A row's logits are the same bits whatever call it is in (by arithmetic), speculative
output equals plain output, the graph matches a PyTorch model that quantizes the same rows, and
the flags that cannot go together are refused."""

import numpy as np
import onnx
import pytest
from tiny import assert_rows_bitwise_alike

from edgespec.engines.manifest import load_manifest
from edgespec.export.target.exporter import ExportConfig, export
from edgespec.export.target.spec import ExportError
from edgespec.runtime.adaptive import ROW_COST
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator

PROMPT = np.array([5, 9, 5, 9, 12, 30, 5, 9, 5, 9, 12, 41, 7], np.int64)


@pytest.fixture(scope="module")
def int8_engine(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "e"
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            draft="self:1",
            out=str(out),
            max_len=128,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision="int8",
            trees=True,
            progress=False,
            eagle="none",
            medusa="none",
        )
    )


def test_manifest_graph_and_validation(int8_engine):
    m = load_manifest(int8_engine)
    assert m.target.precision == "int8" and m.target.graph.flavour == "integer"
    assert "l0.qkv.i8" in m.target.weights and m.target.weights["l0.qkv.i8"].dtype == "int8"
    # PyTorch quantizes the same rows (reference._quantize_rows): only float rounding differs
    assert max(m.target.validation.values()) < 2e-3, m.target.validation


def test_one_row_quantization_per_input(int8_engine):
    m = load_manifest(int8_engine)
    g = onnx.load(m.path(m.target.graph.file), load_external_data=False).graph
    ops = [n.op_type for n in g.node]
    n_layers = m.target.n_layers
    # per layer: the qkv, o, gate_up and down inputs; one for the LM head
    assert ops.count("MatMulIntegerToFloat") == 4 * n_layers + 1
    assert ops.count("ReduceMax") == 4 * n_layers + 1 and "MatMulNBits" not in ops


def test_rows_bitwise_alike(int8_engine):
    assert_rows_bitwise_alike(load_manifest(int8_engine), "int8")


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "draft"])
def test_speculative_output_is_plain_output(int8_engine, drafter):
    want = Generator.load(int8_engine, RuntimeConfig(drafter="none")).generate_ids(PROMPT, 40)
    want = [int(t) for c in want for t in c]
    g = Generator.load(int8_engine, RuntimeConfig(drafter=drafter, k=4))
    assert [int(t) for c in g.generate_ids(PROMPT, 40) for t in c] == want


def test_trees_are_plain_output(int8_engine):
    from edgespec.runtime.tree import TreeConfig

    want = Generator.load(int8_engine, RuntimeConfig(drafter="none")).generate_ids(PROMPT, 40)
    want = [int(t) for c in want for t in c]
    g = Generator.load(int8_engine, RuntimeConfig(drafter="ngram", k=4, tree=TreeConfig(5, 4, 2, 2)))
    assert [int(t) for c in g.generate_ids(PROMPT, 40) for t in c] == want


@pytest.mark.parametrize("graph, precision", [("integer", "int4"), ("lean", "int8"), ("portable", "int8")])
def test_the_integer_graph_is_the_int8_precision(graph, precision, tiny_models, tmp_path):
    with pytest.raises(ExportError, match="integer graph is the int8 precision"):
        ExportConfig(
            target=str(tiny_models["llama"]), out=str(tmp_path / "x"), graph=graph, precision=precision
        ).check()


def test_speculation_score_prefers_cheap_rows():
    from edgespec.export.target.checks.probe import speculation_score

    flat = {1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2}  # rows nearly free: wide calls pay
    steep = {1: 1.0, 2: 1.9, 3: 2.8, 5: 4.6}  # a row costs most of a decode: plain decoding wins
    assert speculation_score(flat) > speculation_score(steep) == 1.0


def test_auto_precision_times_both_graphs_and_records_the_choice(tiny_models, tmp_path):
    out = export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            out=str(tmp_path / "e"),
            max_len=128,
            k=2,
            prefill_chunk=16,
            kv_bucket=32,
            precision="auto",
            progress=False,
            validate=False,
        )
    )
    m = load_manifest(out)
    probe = m.export_probe
    # candidates: int4, int8, and int4-rowop where the row kernel runs here (engines/rowop)
    assert probe["chosen"].split("-")[0] == m.target.precision and {"int4", "int8"} <= set(probe["ms_by_width"])
    assert set(probe["ms_by_width"]["int8"]) == {"1", "2", "3"} and probe["cpu"]
    assert m.target.graph.flavour == ("integer" if m.target.precision == "int8" else "lean")
    # sampled adaptive k with the caller's rng prices verify rows by the recorded table's line (fixed per
    # folder: its draws reproduce); a tiny model's table may not rise (then ROW_COST)
    g = Generator.load(out, RuntimeConfig(drafter="ngram", k=2, adaptive=True))
    costs = g._recorded_costs()
    assert costs is None or (costs[1] == 1.0 and set(costs) == {1, 2, 3} and costs[3] > costs[2] > 1.0)
    assert g._sampled_adaptive().verify_s[3] == (costs[3] if costs else 1 + 2 * ROW_COST["cpu"])
