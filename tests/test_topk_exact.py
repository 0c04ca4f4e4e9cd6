"""The top-k outputs of the decoder graphs are exact: TopK over the logits themselves, so each row's
first id is its first maximum (numpy's argmax, what greedy verification accepts from), even where
two logits differ by less than a Softmax's rounding; the probabilities are the softmax's."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgespec.export.target.graph.builder import GraphBuilder
from edgespec.export.target.graph.store import WeightStore
from edgespec.export.target.graph.writer import _top_k

V, K = 64, 8


def _session(opset: int, softmax_first: bool = False) -> ort.InferenceSession:
    """logits [1, T, V] -> the builder's top-k outputs (or the old Softmax-then-TopK, to show the case)."""
    b = GraphBuilder(WeightStore(), np.dtype(np.float32))
    if softmax_first:
        probs = b.op("Softmax", ["logits"], "/topk/Softmax", axis=-1)
        k_in = b.const("top_k", np.array([K], np.int64))
        b.nodes.append(helper.make_node("TopK", [probs, k_in], ["topk_probs", "topk_ids"], axis=-1))
        outputs = [
            helper.make_tensor_value_info("topk_ids", TensorProto.INT64, [1, "T", K]),
            helper.make_tensor_value_info("topk_probs", TensorProto.FLOAT, [1, "T", K]),
        ]
    else:
        outputs = _top_k(b, K)
    graph = helper.make_graph(
        b.nodes,
        "topk",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "T", V])],
        outputs,
        initializer=b.consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _near_ties() -> np.ndarray:
    """Rows [T, V] whose two largest logits differ by one ulp (their softmax probabilities round to the
    same float32: exp(-ulp) == 1), the larger at the higher id; exact ties; and plain random rows."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((12, V)).astype(np.float32) - 4
    for i, (lo, hi) in enumerate([(3, 7), (0, 63), (10, 11), (5, 40)]):
        a = np.float32(0.1 * (i + 1))
        rows[i, lo], rows[i, hi] = a, np.nextafter(a, np.float32(1))
    for i, (lo, hi) in enumerate([(2, 5), (0, 1), (30, 60)], start=4):
        rows[i, lo] = rows[i, hi] = 0.5  # exact ties: the lower id first
    return rows


@pytest.mark.parametrize("opset", [17, 18])  # the portable/integer graphs' and the lean graphs' opsets
def test_first_id_is_the_logits_argmax_on_near_ties(opset):
    rows = _near_ties()
    ids, probs = _session(opset).run(["topk_ids", "topk_probs"], {"logits": rows[None]})
    ids, probs = ids[0], probs[0]
    assert np.array_equal(ids[:, 0], rows.argmax(-1))
    assert np.array_equal(ids, np.argsort(-rows, axis=-1, kind="stable")[:, :K])  # ties: lower id first
    p = np.exp(rows.astype(np.float64) - rows.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert probs.dtype == np.float32 and np.allclose(probs, np.take_along_axis(p, ids, -1), rtol=1e-6, atol=1e-7)
    # the case it fixes: a Softmax first rounds the near ties to one probability and ranks the lower id first
    old = _session(opset, softmax_first=True).run(["topk_ids"], {"logits": rows[None]})[0][0]
    assert (old[:4, 0] != rows[:4].argmax(-1)).any()


def test_every_top_k_graph_flavour_uses_the_builder():
    """One builder writes the top-k of every graph that has one (lean, integer, rowop target and
    draft graphs: graph/writer.py's _token_model); no Softmax feeds a TopK anywhere in the exporter."""
    from pathlib import Path

    import edgespec.export as ex

    sources = {p: p.read_text() for p in Path(ex.__file__).parent.rglob("*.py")}
    writers = [p.name for p, s in sources.items() if '"TopK"' in s]
    assert writers == ["writer.py"], writers
    assert "/topk/Softmax" not in sources[next(p for p in sources if p.name == "writer.py")]


def test_greedy_accept_from_argmax_ids_is_accept_from_logits():
    """verify.accept_argmax (a greedy verify that left its logits on the device) keeps what accept
    keeps from the logits, on chains and trees with ties, -inf and extreme values (test_properties'
    cases), given each row's first maximum."""
    pytest.importorskip("hypothesis")
    from helpers.strategies import FAST, chain_case, tree_case
    from hypothesis import given

    from edgespec.runtime.sampling import SamplingConfig
    from edgespec.runtime.state import Proposal, SeqState
    from edgespec.runtime.verify import accept, accept_argmax

    def seq():
        return SeqState(tokens=np.zeros(64, np.int64), n=3, n_prompt=3, tgt_past=2)

    @FAST
    @given(chain_case())
    def chains(case):
        draft, tgt = case
        prop = Proposal(np.concatenate([[0], draft]).astype(np.int64))
        ids = tgt.argmax(-1)
        assert accept_argmax(prop, ids, seq()) == accept(prop, tgt, seq(), SamplingConfig(), None)

    @FAST
    @given(tree_case())
    def trees(case):
        tree, tgt = case
        prop = Proposal(tree.tokens[: tree.n], tree.parents[: tree.n], None, tree)
        a, b = seq(), seq()
        want = accept(prop, tgt, a, SamplingConfig(), None)
        path = tree.path[: want[0] + 1].copy()
        assert accept_argmax(prop, tgt.argmax(-1), b) == want
        assert np.array_equal(tree.path[: want[0] + 1], path) and np.array_equal(a.tokens, b.tokens)

    chains()
    trees()
