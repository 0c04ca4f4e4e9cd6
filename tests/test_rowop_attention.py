"""edgespec's exact attention op (engines/rowop/attention.h: RowAttention): every instruction-set path
gives the same bits and the float64 reference to rounding; a row's bits do not depend on the call's
width, the other rows, the task split, or tree against chain; RowQkvAttention is the split, the
rotation and the op; tiny llama / qwen2 / qwen3 / gemma3 (sliding layers) exported with --int4-kernel
rowop run one of them in every layer, keep their rows bitwise alike in prefill / verify / decode
calls and on tree rows, and decode speculatively exactly as plainly."""

import numpy as np
import pytest
from tiny import GEMMA3_FIELDS, TINY_EXPORT, assert_rows_bitwise_alike, make_tiny, rowop_session

from edgespec.engines import rowop
from edgespec.engines.rowop import attention as ra

WHY = rowop.unavailable()
needs_op = pytest.mark.skipif(bool(WHY), reason=f"row kernel not available: {WHY}")


def _paths() -> list[str]:
    return [p for p in rowop.PATHS if rowop.cpu_runs(p)] if not WHY else []


def _seq(rng, n: int, hq: int, hkv: int, d: int):
    """q, k, v rows of n positions (scores of a few units, so the softmax is neither flat nor one-hot)."""
    q = (rng.standard_normal((n, hq * d)) * 1.5).astype(np.float32)
    k = rng.standard_normal((n, hkv * d)).astype(np.float32)
    v = rng.standard_normal((n, hkv * d)).astype(np.float32)
    return q, k, v


def _window(k: np.ndarray, past: int, slots: int, rng) -> np.ndarray:
    """A cache window of `slots` rows: positions < past from k, the rest garbage (must not be read)."""
    w = (rng.standard_normal((slots, k.shape[1])) * 1e3).astype(np.float32)
    w[:past] = k[:past]
    return w


def _tree(rng, n: int, shuffle: bool) -> tuple[np.ndarray, list[list[int]]]:
    """(tree_mask [n, n], each node's root-to-node path): random parents; shuffle: nodes numbered out
    of topological order (a parent may come after its child)."""
    parents = [-1] + [int(rng.integers(i)) for i in range(1, n)]
    order = rng.permutation(n) if shuffle else np.arange(n)  # node i is numbered order[i]
    paths = []
    for i in range(n):
        p, j = [], i
        while j >= 0:
            p.append(j)
            j = parents[j]
        paths.append([int(order[x]) for x in reversed(p)])
    mask = np.zeros((n, n), np.int64)
    by_number = [None] * n
    for i in range(n):
        by_number[order[i]] = paths[i]
        mask[order[i], paths[i]] = 1
    return mask, by_number


# (T, past, Hq, Hkv, D, window, tree): D 40 and 24 leave tails after the vector widths
CASES = [
    (1, 0, 4, 2, 16, 0, False),
    (1, 37, 9, 3, 64, 0, False),
    (5, 20, 4, 2, 16, 0, True),
    (16, 100, 8, 8, 40, 0, False),
    (37, 50, 6, 2, 32, 7, True),
    (64, 200, 9, 3, 64, 0, False),
    (9, 30, 4, 1, 24, 12, True),
    (3, 5, 2, 2, 8, 2, False),
    (12, 0, 4, 2, 64, 5, True),
]


@needs_op
@pytest.mark.parametrize("case", CASES)
def test_paths_agree_bitwise_and_with_the_reference(case):
    t, past, hq, hkv, d, window, tree = case
    rng = np.random.default_rng(t * 1000 + past)
    q, k, v = _seq(rng, t, hq, hkv, d)
    pk, pv = _seq(rng, past + 3, hkv, hkv, d)[1:]
    kc, vc = _window(pk, past, past + 3, rng), _window(pv, past, past + 3, rng)
    mask = _tree(rng, t, shuffle=True)[0] if tree else None
    args = (q, k, v, kc, vc, past, hq, hkv, d, 0.3, window, mask)
    want = ra.reference(*args)
    outs = {p: ra.run(p, *args) for p in _paths()}
    for p, got in outs.items():
        assert np.allclose(got, want, rtol=2e-5, atol=2e-5), (p, case, np.abs(got - want).max())
        for rows in (1, 3, 1000):  # the task split
            assert np.array_equal(ra.run(p, *args, rows_per_task=rows), got), (p, case, rows)
    first = next(iter(outs.values()))
    for p, got in outs.items():
        assert np.array_equal(got, first), (p, case, np.abs(got - first).max())


@needs_op
@pytest.mark.parametrize("window", [0, 6])
def test_tree_rows_are_chain_rows(window):
    """A tree node's row is the row of its root-to-node chain's last token, bitwise, on every path
    (nodes numbered in and out of topological order)."""
    hq, hkv, d, past, n = 6, 2, 32, 21, 12
    rng = np.random.default_rng(window)
    q, k, v = _seq(rng, n, hq, hkv, d)
    pk, pv = _seq(rng, past, hkv, hkv, d)[1:]
    for shuffle in (False, True):
        mask, node_paths = _tree(rng, n, shuffle)
        for p in _paths():
            tree = ra.run(p, q, k, v, pk, pv, past, hq, hkv, d, 0.25, window, mask)
            for node, path in enumerate(node_paths):
                chain = ra.run(p, q[path], k[path], v[path], pk, pv, past, hq, hkv, d, 0.25, window)
                assert np.array_equal(tree[node], chain[-1]), (p, shuffle, node)


def _session(hq, hkv, d, scale, window, tree, path):
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, "T", hq * d]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, "T", hkv * d]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, "T", hkv * d]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["S", hkv * d]),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, ["S", hkv * d]),
        helper.make_tensor_value_info("past_len", TensorProto.INT64, [1]),
    ] + ([helper.make_tensor_value_info("tree_mask", TensorProto.INT64, ["T", "T"])] if tree else [])
    node = helper.make_node(
        ra.OP_TYPE,
        [i.name for i in inputs],
        ["y"],
        domain=rowop.DOMAIN,
        num_heads=hq,
        kv_heads=hkv,
        head_dim=d,
        scale=scale,
        window=window,
    )
    graph = helper.make_graph([node], "attn", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
    return rowop_session(model, path)


@needs_op
@pytest.mark.parametrize("window", [0, 5])
def test_op_rows_bitwise_alike_across_widths_and_paths(window):
    """In ONNX Runtime (2 threads), each path forced: rows of widths 1..16 and 64 at two cache
    lengths equal the one-row calls of their positions (each at its own window size), and every path
    gives the same bits."""
    hq, hkv, d, scale = 9, 3, 64, 0.125
    rng = np.random.default_rng(7 + window)
    n = 200 + 64
    q, k, v = _seq(rng, n, hq, hkv, d)
    rows = {}
    for path in _paths():
        sess = _session(hq, hkv, d, scale, window, False, path)

        def call(past, t, slots, sess=sess):
            feeds = {
                "q": q[None, past : past + t],
                "k": k[None, past : past + t],
                "v": v[None, past : past + t],
                "past_key": _window(k, past, slots, rng),
                "past_value": _window(v, past, slots, rng),
                "past_len": np.array([past], np.int64),
            }
            return sess.run(None, feeds)[0][0]

        one = {p: call(p, 1, p + 1 + p % 7)[0] for p in list(range(10, 30)) + list(range(200, 264))}
        for past in (10, 200):
            for t in list(range(1, 17)) + ([64] if past == 200 else []):
                wide = call(past, t, past + t + 32)
                for i in range(t):
                    assert np.array_equal(wide[i], one[past + i]), (path, window, past, t, i)
        rows[path] = np.stack([one[p] for p in sorted(one)])
        want = np.stack(
            [
                ra.reference(q[p : p + 1], k[p : p + 1], v[p : p + 1], k, v, p, hq, hkv, d, scale, window)[0]
                for p in sorted(one)
            ]
        )
        assert np.allclose(rows[path], want, rtol=2e-5, atol=2e-5), path
    for path, r in rows.items():
        assert np.array_equal(r, next(iter(rows.values()))), path


@needs_op
def test_op_trees_in_onnx_runtime():
    hq, hkv, d, past, n = 4, 2, 16, 40, 10
    rng = np.random.default_rng(3)
    q, k, v = _seq(rng, n, hq, hkv, d)
    pk, pv = _seq(rng, past, hkv, hkv, d)[1:]
    mask, node_paths = _tree(rng, n, shuffle=True)
    sess = _session(hq, hkv, d, 0.25, 0, True, rowop.cpu_path())
    feeds = dict(q=q[None], k=k[None], v=v[None], past_key=pk, past_value=pv, past_len=np.array([past], np.int64))
    got = sess.run(None, feeds | {"tree_mask": mask})[0][0]
    assert np.array_equal(got, ra.run(rowop.cpu_path(), q, k, v, pk, pv, past, hq, hkv, d, 0.25, 0, mask))
    chain = sess.run(None, feeds | {"tree_mask": np.tril(np.ones((n, n), np.int64))})[0][0]
    assert np.array_equal(chain, ra.run(rowop.cpu_path(), q, k, v, pk, pv, past, hq, hkv, d, 0.25))


@needs_op
@pytest.mark.parametrize("tree", [False, True])
def test_qkv_op_is_the_split_rotation_then_the_op(tree):
    """RowQkvAttention(qkv, ..., positions, cos, sin) = RowAttention(rotate(q), rotate(k), v, ...) and
    its k, v outputs the rotated k and v, bitwise, each path."""
    from onnx import TensorProto, helper

    hq, hkv, d, past, t, n_pos = 4, 2, 32, 30, 7, 64
    rng = np.random.default_rng(11)
    q, k, v = _seq(rng, t, hq, hkv, d)
    pk, pv = _seq(rng, past, hkv, hkv, d)[1:]
    ang = np.arange(n_pos)[:, None] / 100.0 ** (np.arange(d // 2) / (d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = past + np.arange(t)
    mask = _tree(rng, t, shuffle=False)[0] if tree else None
    if tree:  # positions by depth
        pos = past + mask.sum(axis=1) - 1
    want = {"k": ra.rotate(k, cos[pos], sin[pos], d), "v": v}
    qr = ra.rotate(q, cos[pos], sin[pos], d)
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("qkv", f, [1, "T", (hq + 2 * hkv) * d]),
        helper.make_tensor_value_info("past_key", f, ["S", hkv * d]),
        helper.make_tensor_value_info("past_value", f, ["S", hkv * d]),
        helper.make_tensor_value_info("past_len", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("positions", TensorProto.INT64, [1, "T"]),
        helper.make_tensor_value_info("cos", f, [n_pos, d // 2]),
        helper.make_tensor_value_info("sin", f, [n_pos, d // 2]),
    ] + ([helper.make_tensor_value_info("tree_mask", TensorProto.INT64, ["T", "T"])] if tree else [])
    attrs = dict(num_heads=hq, kv_heads=hkv, head_dim=d, scale=0.25, window=0)
    node = helper.make_node(ra.QKV_OP_TYPE, [i.name for i in inputs], ["y", "k", "v"], domain=rowop.DOMAIN, **attrs)
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("y", "k", "v")]
    model = helper.make_model(
        helper.make_graph([node], "qkv", inputs, outs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)],
    )
    feeds = {
        "qkv": np.concatenate([q, k, v], axis=1)[None],
        "past_key": pk,
        "past_value": pv,
        "past_len": np.array([past], np.int64),
        "positions": pos[None].astype(np.int64),
        "cos": cos,
        "sin": sin,
    } | ({"tree_mask": mask} if tree else {})
    for path in _paths():
        sess = rowop_session(model, path)
        y, k_out, v_out = (o[0] for o in sess.run(None, feeds))
        assert np.array_equal(k_out, want["k"]) and np.array_equal(v_out, want["v"]), path
        assert np.array_equal(y, ra.run(path, qr, want["k"], v, pk, pv, past, hq, hkv, d, 0.25, 0, mask)), path
        with pytest.raises(Exception, match="outside the rotary tables"):
            sess.run(None, feeds | {"positions": (pos[None] + n_pos).astype(np.int64)})


@needs_op
@pytest.mark.parametrize("inter", [37, 1536])
def test_swiglu_op_every_path_and_width(inter):
    """RowSwiGLU: (g / (1 + exp(-g))) * u within rounding of float64, the same bits on every path and
    for a row alone or in a call of 64 (tails after the vector widths: inter 37)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(inter)
    x = (rng.standard_normal((64, 2 * inter)) * 4).astype(np.float32)
    x[0, :6] = [0.0, -0.0, 100.0, -100.0, 88.5, -88.5]
    g, u = x[:, :inter].astype(np.float64), x[:, inter:].astype(np.float64)
    want = g / (1 + np.exp(-g)) * u
    node = helper.make_node(ra.SWIGLU_OP_TYPE, ["x"], ["y"], domain=rowop.DOMAIN, inter=inter)
    graph = helper.make_graph(
        [node],
        "swiglu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", 2 * inter])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
    got = {}
    for path in _paths():
        sess = rowop_session(model, path)
        got[path] = sess.run(None, {"x": x[None]})[0][0]
        assert got[path].shape == (64, inter)
        assert np.allclose(got[path], want, rtol=1e-5, atol=1e-6), (path, np.abs(got[path] - want).max())
        for r in (0, 5, 63):
            assert np.array_equal(sess.run(None, {"x": x[None, r : r + 1]})[0][0, 0], got[path][r]), (path, r)
    for path, y in got.items():
        assert np.array_equal(y, next(iter(got.values()))), path


@needs_op
def test_op_refuses_bad_shapes_and_a_past_beyond_the_window():
    hq, hkv, d = 4, 2, 16
    rng = np.random.default_rng(4)
    q, k, v = _seq(rng, 3, hq, hkv, d)
    sess = _session(hq, hkv, d, 0.25, 0, False, rowop.cpu_path())
    feeds = dict(q=q[None], k=k[None], v=v[None], past_key=k, past_value=v, past_len=np.array([4], np.int64))
    with pytest.raises(Exception, match="outside the window of 3 slots"):
        sess.run(None, feeds)
    with pytest.raises(Exception, match="shapes"):
        sess.run(None, feeds | {"k": k[None, :2], "past_len": np.array([1], np.int64)})


# ---- a half (fp16) cache ---------------------------------------------------------------------------
def test_round_half_is_numpys():
    """The op's fp32 -> fp16 rounding of a call's new rows is numpy's astype (how the engine commits
    them): every half's midpoints (ties to even), overflow, subnormals, signed zeros."""
    if WHY:
        pytest.skip(WHY)
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mid = ((h[:-1] + h[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    scales = (1e-8, 1e-5, 1.0, 1e3, 6e4)
    x = np.concatenate(
        [mid, -mid, h.astype(np.float32)] + [rng.standard_normal(20000).astype(np.float32) * s for s in scales]
    )
    x = np.concatenate([x, np.array([65519.99, 65520, 1e9, -np.inf, 2**-25, 3 * 2**-26, -0.0], np.float32)])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert np.array_equal(ra.round_half(x).view(np.uint16), want.view(np.uint16))


def _half_case(rng, t, past, hq, hkv, d):
    q, k, v = _seq(rng, t, hq, hkv, d)
    pk, pv = _seq(rng, past + 3, hkv, hkv, d)[1:]
    return q, k, v, pk.astype(np.float16), pv.astype(np.float16)


def _rounded(x):
    return x.astype(np.float16).astype(np.float32)


@needs_op
@pytest.mark.parametrize("case", CASES)
def test_half_cache_is_the_float_op_on_rounded_rows(case):
    """A half cache: the window widened and the call's new keys and values rounded to fp16 first, then
    the float op, bit for bit on every path and task split (so the rule holds with it as without)."""
    t, past, hq, hkv, d, window, tree = case
    rng = np.random.default_rng(t * 1000 + past + 1)
    q, k, v, kc, vc = _half_case(rng, t, past, hq, hkv, d)
    mask = _tree(rng, t, shuffle=True)[0] if tree else None
    first = None
    for p in _paths():
        got = ra.run(p, q, k, v, kc, vc, past, hq, hkv, d, 0.3, window, mask)
        want = ra.run(
            p,
            q,
            _rounded(k),
            _rounded(v),
            kc.astype(np.float32),
            vc.astype(np.float32),
            past,
            hq,
            hkv,
            d,
            0.3,
            window,
            mask,
        )
        assert np.array_equal(got, want), (p, case)
        assert np.array_equal(ra.run(p, q, k, v, kc, vc, past, hq, hkv, d, 0.3, window, mask, rows_per_task=3), got)
        first = got if first is None else first
        assert np.array_equal(got, first), (p, case)


def _half_session(hq, hkv, d, path, qkv=False):
    """RowAttention (or RowQkvAttention) with no tree_mask ("") and the half cache inputs."""
    from onnx import TensorProto, helper

    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    rows = [("qkv", (hq + 2 * hkv) * d)] if qkv else [("q", hq * d), ("k", hkv * d), ("v", hkv * d)]
    inputs = [helper.make_tensor_value_info(n, f, [1, "T", w]) for n, w in rows]
    inputs += [helper.make_tensor_value_info(n, f, ["S", hkv * d]) for n in ("past_key", "past_value")]
    inputs.append(helper.make_tensor_value_info("past_len", TensorProto.INT64, [1]))
    tables = []
    if qkv:
        inputs.append(helper.make_tensor_value_info("positions", TensorProto.INT64, [1, "T"]))
        ang = np.arange(512)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
        tables = [
            helper.make_tensor(n, f, ang.shape, fn(ang).astype(np.float32).ravel())
            for n, fn in (("cos", np.cos), ("sin", np.sin))
        ]
    half = [helper.make_tensor_value_info(n, h, ["S16", hkv * d]) for n in ("past_key_f16", "past_value_f16")]
    names = [i.name for i in inputs] + (["cos", "sin"] if qkv else []) + ["", "past_key_f16", "past_value_f16"]
    node = helper.make_node(
        ra.QKV_OP_TYPE if qkv else ra.OP_TYPE,
        names,
        ["y", "k_out", "v_out"] if qkv else ["y"],
        domain=rowop.DOMAIN,
        num_heads=hq,
        kv_heads=hkv,
        head_dim=d,
        scale=0.125,
    )
    outs = [helper.make_tensor_value_info(n, f, None) for n in node.output]
    graph = helper.make_graph([node], "attn", inputs + half, outs, initializer=tables)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(rowop.DOMAIN, 1)])
    return rowop_session(model, path)


@needs_op
@pytest.mark.parametrize("qkv", [False, True])
def test_op_reads_the_half_cache_inputs_when_they_hold_rows(qkv):
    """In ONNX Runtime: with the f16 inputs holding the window (the float ones empty) the op is the
    half-cache form; with them empty, the float op as before; RowQkvAttention's k, v outputs stay
    unrounded (the engine rounds them as it commits)."""
    hq, hkv, d, past, t = 9, 3, 64, 70, 5
    rng = np.random.default_rng(11)
    q, k, v, kc, vc = _half_case(rng, t, past, hq, hkv, d)
    empty32, empty16 = np.zeros((0, hkv * d), np.float32), np.zeros((0, hkv * d), np.float16)
    feeds = {"past_len": np.array([past], np.int64)}
    if qkv:
        x = np.concatenate([q, k, v], axis=1)[None]
        feeds |= {"qkv": x, "positions": (past + np.arange(t))[None]}
        ang = np.arange(512)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
        pos = past + np.arange(t)
        cos, sin = np.cos(ang).astype(np.float32)[pos], np.sin(ang).astype(np.float32)[pos]
        q, k = ra.rotate(q, cos, sin, d), ra.rotate(k, cos, sin, d)
    else:
        feeds |= {"q": q[None], "k": k[None], "v": v[None]}
    for path in _paths():
        sess = _half_session(hq, hkv, d, path, qkv)
        half = sess.run(None, feeds | dict(past_key=empty32, past_value=empty32, past_key_f16=kc, past_value_f16=vc))
        want = ra.run(path, q, k, v, kc, vc, past, hq, hkv, d, 0.125)
        assert np.array_equal(half[0][0], want), path
        full = sess.run(
            None,
            feeds
            | dict(
                past_key=kc.astype(np.float32),
                past_value=vc.astype(np.float32),
                past_key_f16=empty16,
                past_value_f16=empty16,
            ),
        )
        assert np.array_equal(
            full[0][0], ra.run(path, q, k, v, kc.astype(np.float32), vc.astype(np.float32), past, hq, hkv, d, 0.125)
        )
        if qkv:
            assert np.array_equal(half[1][0], k) and np.array_equal(half[2][0], v)


# ---- the rowop flavour's graphs --------------------------------------------------------------------
FAMILIES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),  # q/k/v biases before the op's split
    "qwen3": ("qwen3", {}),
    "gemma3": (  # layer 0 sliding with a window the rows cross, layer 1 full
        "gemma3_text",
        GEMMA3_FIELDS,
    ),
}
PROMPT = np.array([5, 9, 5, 9, 12, 30, 5, 9, 5, 9, 12, 41, 7, 5, 9, 5, 9, 12], np.int64)


@pytest.fixture(scope="module")
def rowop_folders(tmp_path_factory):
    pytest.importorskip("torch")
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("rowop_attention")
    out = {}
    for name, (mt, kw) in FAMILIES.items():
        src = make_tiny(mt, root / f"{name}-hf", **kw)
        opts = TINY_EXPORT | dict(precision="int4", int4_kernel="rowop", k=4)
        out[name] = export(ExportConfig(target=str(src), out=str(root / name), eagle="none", medusa="none", **opts))
    return out


@needs_op
@pytest.mark.parametrize("name", list(FAMILIES))
def test_folder_attention_is_the_op_and_keeps_the_rule(rowop_folders, name):
    import onnx

    from edgespec.engines.context import at_load
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    m = load_manifest(rowop_folders[name])
    g = onnx.load(m.path(m.target.graph.file), load_external_data=False).graph
    ops = [n.op_type for n in g.node]
    norms = name in ("qwen3", "gemma3")  # q/k norms between the split and RoPE: the unfused op
    kind = ra.OP_TYPE if norms else ra.QKV_OP_TYPE
    assert ops.count(kind) == m.target.n_layers, name
    assert not {"Gemm", "Softmax", "ScatterElements", "ScatterND", "GatherElements", "CumSum"} & set(ops), name
    assert ("RotaryEmbedding" in ops) == norms, name
    silu = name != "gemma3"  # Gemma's GELU MLP keeps its ops
    assert ops.count(ra.SWIGLU_OP_TYPE) == (m.target.n_layers if silu else 0) and "QuickGelu" not in ops
    windows = [
        onnx.helper.get_attribute_value(a)
        for n in g.node
        if n.op_type == kind
        for a in n.attribute
        if a.name == "window"
    ]
    assert windows == ([8, 0] if name == "gemma3" else [0, 0]), windows
    assert_rows_bitwise_alike(m, name)  # the fp32 cache (the manifest as read: the graphs' own dtype)
    half = at_load(m)  # the default at load: the half cache the op reads
    assert half.kv_cache_dtype == "float16" and OrtModel(half, half.target).kv.dtype == np.float16
    assert_rows_bitwise_alike(half, name + " fp16")
    for kv in ("fp16", "fp32"):  # speculative == plain within each cache type
        want = Generator.load(rowop_folders[name], RuntimeConfig(drafter="none", kv_dtype=kv)).generate_ids(PROMPT, 40)
        want = [int(t) for c in want for t in c]
        for drafter in ("ngram", "suffix"):
            g = Generator.load(rowop_folders[name], RuntimeConfig(drafter=drafter, k=4, kv_dtype=kv))
            assert g.target.kv.dtype == np.dtype(np.float16 if kv == "fp16" else np.float32)
            assert [int(t) for c in g.generate_ids(PROMPT, 40) for t in c] == want, (name, drafter, kv)


@needs_op
@pytest.mark.parametrize("name", list(FAMILIES))
def test_folder_tree_rows_are_chain_rows(rowop_folders, name):
    """As test_lean_graph's trees: a tree verify call's path rows equal the decode rows bitwise."""
    from helpers.rows import assert_tree_rows_are_chain_rows

    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    m = load_manifest(rowop_folders[name])
    assert_tree_rows_are_chain_rows(OrtModel(m, m.target), (20, 41), 5, name)


@needs_op
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_folder_logits_are_the_same_bits_on_every_path(rowop_folders, name, monkeypatch):
    """The whole model (row kernel and attention) gives the same logits whichever path runs it."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    m = load_manifest(rowop_folders[name])
    toks = np.random.default_rng(1).integers(3, 256, 40)
    got = {}
    for path in _paths():
        monkeypatch.setenv(rowop.ISA_ENV, path)
        e = OrtModel(m, m.target)
        e.forward(toks[:16], 0)
        e.commit(0, 16)
        got[path] = (e.forward(toks[16:32], 16).copy(), e.forward(toks[16:20], 16).copy())
    first = next(iter(got.values()))
    for path, (wide, verify) in got.items():
        assert np.array_equal(wide, first[0]) and np.array_equal(verify, first[1]), (name, path)
