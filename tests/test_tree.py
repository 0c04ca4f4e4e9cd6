"""Token trees: a tree verify computes, for every root-to-node path, bitwise what a chain would."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rows import random_tree


@pytest.fixture(scope="module", params=["fp32", "int4"])
def tree_model(request, tmp_path_factory):
    """A tiny llama whose K/V rows are 192 wide like SmolLM2-135M's (3 kv heads x 64): the
    attention GEMMs then split the context into blocks the way the real model's do."""
    from tiny import make_tiny

    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("tree")
    src = make_tiny("llama", root / "src", hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=64)
    out = root / request.param
    export(
        ExportConfig(
            target=str(src),
            out=str(out),
            max_len=320,
            k=4,
            prefill_chunk=16,
            kv_bucket=32,
            precision=request.param,
            trees=True,
            progress=False,
        )
    )
    m = load_manifest(out)
    return OrtModel(m, m.target)


@pytest.mark.parametrize("past", [20, 30, 60, 62, 95, 120, 124, 126, 127, 250])
def test_tree_rows_equal_chain_rows_bitwise(tree_model, past):
    from edgespec.runtime.prefill import prefill
    from edgespec.runtime.tree import tree_chain_prefix

    m = tree_model
    rng = np.random.default_rng(past)
    seq = rng.integers(3, m.vocab_size, past + 8).astype(np.int64)
    path = seq[past : past + 5]  # root (the pending token) + 4 tokens
    prefill(m, seq[:past], 0)
    ref = []
    for i, t in enumerate(path):  # the chain, one decode at a time
        ref.append(m.forward(np.array([t]), past + i)[0].copy())
        m.commit(past + i, 1)
    ref_next = m.forward(seq[past + 5 : past + 6], past + 5)[0].copy()
    # across a multiple of 128 slots the attention GEMM sums in separate blocks: the nodes before
    # the boundary must be a chain there (what the runtime's trees do: runtime.tree.tree_chain_prefix)
    n_chain = tree_chain_prefix(past, 14)
    tokens, parents, on_path = random_tree(rng, path, 14, m.vocab_size, n_chain)
    logits = m.forward(tokens, past, parents=parents).copy()
    for d, node in enumerate(on_path):
        assert np.array_equal(logits[node], ref[d]), f"depth {d} (node {node}) differs from the chain"
    m.commit(past, len(on_path), rows=on_path)  # compaction: the path's K/V into consecutive slots
    assert np.array_equal(m.forward(seq[past + 5 : past + 6], past + 5)[0], ref_next)
    # a chain call after the tree sees the chain mask again
    chain = m.forward(path, past).copy()
    assert np.array_equal(chain[-1], ref[-1])


def test_chain_only_folders_have_no_tree_ops_and_refuse_trees(tiny_models, tmp_path):
    """--no-trees leaves tree attention out; asking such a folder for trees says what to do."""
    import onnx

    from edgespec.export.target.exporter import ExportConfig, export
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    out = export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            out=str(tmp_path / "e"),
            max_len=64,
            k=4,
            prefill_chunk=8,
            kv_bucket=16,
            precision="fp32",
            trees=False,
            progress=False,
        )
    )
    g = onnx.load(str(out / "target.onnx"), load_external_data=False)
    assert "tree_mask" not in {i.name for i in g.graph.input}
    assert not any(n.op_type == "GatherElements" for n in g.graph.node)
    with pytest.raises(ValueError, match="--no-trees"):
        Generator.load(out, RuntimeConfig(drafter="ngram", k=4, tree=TreeConfig(5, 4, 1, 1)))


def test_keep_best_keeps_the_top_scores_and_their_ancestors():
    from edgespec.runtime.tree import TokenTree

    t = TokenTree(8)
    t.reset(100)
    a = t.add(0, 1, 0.6)
    b = t.add(0, 2, 0.3)
    t.add(a, 3, 0.5)  # 0.6 * p
    t.add(b, 4, 0.2)
    t.add(a, 5, 0.05)
    t.keep_best(4)  # root + 0.6, 0.5, 0.3
    assert t.n == 4 and t.tokens[:4].tolist() == [100, 1, 2, 3] and t.parents[:4].tolist() == [-1, 0, 0, 1]
    assert t.depth[:4].tolist() == [0, 1, 1, 2]
    t.keep_best(1)
    assert t.n == 1 and t.tokens[0] == 100
    # a merged tree (hybrid) may score a child above its parent: the child ranks by its path's
    # lowest score, so it never comes without its parent
    t.reset(100)
    a = t.add(0, 1, 0.2)
    t.add(0, 2, 0.5)
    t.add(a, 3, 0.9)
    assert t.path_scores().tolist() == [1.0, 0.2, 0.5, 0.2]
    t.keep_best(3)
    assert t.tokens[:3].tolist() == [100, 1, 2] and t.parents[:3].tolist() == [-1, 0, 0]


def test_tree_budget_sizes_trees_from_the_width_table():
    """E(n) / verify(n): free rows keep every node worth anything, dear rows keep the sure ones
    only, and the calibration follows what the target accepts."""
    from edgespec.runtime.adaptive import TreeBudget

    scores = np.array([0.9, 0.8, 0.5, 0.3, 0.1, 0.05])
    cheap = TreeBudget(7, {w: 1.0 + 0.01 * (w - 1) for w in range(1, 8)})
    assert cheap.choose(scores) == 7
    dear = TreeBudget(7, {w: 1.0 + 0.8 * (w - 1) for w in range(1, 8)})
    assert dear.choose(scores) == 2  # (1 + 0.9) / 1.8 beats (1 + 1.7) / 2.6 and plain's 1 / 1
    mid = TreeBudget(7, {w: 1.0 + 0.25 * (w - 1) for w in range(1, 8)})
    n = mid.choose(scores)
    assert 2 < n < 7
    chosen = []
    for _ in range(64):  # the target keeps nothing: r falls and the budget shrinks to plain decoding
        mid.observe(n, 0, 1.0 + 0.25 * (n - 1))
        n = mid.choose(scores)
        chosen.append(n)
    assert mid.calibration < 0.3 and chosen[-16:].count(1) == 15  # and probes the whole tree now and then
    # drafting stops below the score that could pay the cheapest extra row: 0.25 / r
    fresh = TreeBudget(7, {w: 1.0 + 0.25 * (w - 1) for w in range(1, 8)})
    assert fresh.floor() == pytest.approx(0.25) and mid.floor() in (0.0, pytest.approx(0.25 / mid.calibration))
    assert TreeBudget(7, {w: 1.0 for w in range(1, 8)}).floor() == 0.0  # free rows: draft everything
