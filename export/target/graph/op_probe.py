"""What this CPU's ONNX Runtime computes row for row alike, probed at export on random rows: the
lean flavour's fused ops (probe_portable_ops) and the 1-row int4 MatMulNBits (one_row_int4_differs)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from edgespec.export.target.graph.builder import NP_TO_ONNX, OPSET
from edgespec.export.target.graph.lean import LEAN_OPSET
from edgespec.export.target.quant.quantize import quantize_int4


def probe_portable_ops(
    hidden: int = 576, n_heads: int = 9, head_dim: int = 64, inter: int = 1536, rows: int = 9
) -> tuple[str, ...]:
    """The fused ops of LEAN_OPS that break the rule on this CPU's ONNX Runtime: each run alone on
    random rows, one row at a time against all rows in one call (all bitwise alike on ORT 1.32,
    AVX-512 Xeon and EPYC alike; docs/design.md). The export writes those in portable form."""
    rng = np.random.default_rng(0)
    io, init = _io, _init

    def breaks(node, inputs, width: int, inits, feeds: dict[str, np.ndarray]) -> bool:
        return _breaks(node, inputs, [io("y", width)], inits, feeds, rows)

    x = (rng.standard_normal((1, rows, hidden)) * 3).astype(np.float32)
    skip = rng.standard_normal((1, rows, hidden)).astype(np.float32)
    gamma = init("w", rng.standard_normal(hidden).astype(np.float32))
    out = []
    norm = helper.make_node(
        "SkipSimplifiedLayerNormalization", ["x", "s", "w"], ["y"], domain="com.microsoft", epsilon=1e-5
    )
    plain = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-5)
    if breaks(norm, [io("x", hidden), io("s", hidden)], hidden, [gamma], {"x": x, "s": skip}) or breaks(
        plain, [io("x", hidden)], hidden, [gamma], {"x": x}
    ):
        out.append("norm")
    width = n_heads * head_dim
    ang = np.arange(4096)[:, None] / 10000 ** (np.arange(0, head_dim, 2) / head_dim)
    rope = helper.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", num_heads=n_heads, interleaved=0
    )
    pos = (np.arange(rows) + 100)[None].astype(np.int64)
    if breaks(
        rope,
        [io("x", width), helper.make_tensor_value_info("pos", TensorProto.INT64, [1, "T"])],
        width,
        [init("cos", np.cos(ang).astype(np.float32)), init("sin", np.sin(ang).astype(np.float32))],
        {"x": rng.standard_normal((1, rows, width)).astype(np.float32), "pos": pos},
    ):
        out.append("rotary")
    act_rows = {"x": (rng.standard_normal((1, rows, inter)) * 4).astype(np.float32)}
    silu = helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.0)
    if breaks(silu, [io("x", inter)], inter, [], act_rows):
        out.append("silu")
    if breaks(
        helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft"), [io("x", inter)], inter, [], act_rows
    ):
        out.append("gelu")
    return tuple(out)


def _io(name: str, width: int, dtype=TensorProto.FLOAT):
    """A [1, T, width] graph input or output."""
    return helper.make_tensor_value_info(name, dtype, [1, "T", width])


def _init(name: str, arr: np.ndarray):
    """A float32 initializer."""
    return helper.make_tensor(name, TensorProto.FLOAT, arr.shape, arr.tobytes(), raw=True)


def _breaks(node, inputs, outputs, inits, feeds: dict[str, np.ndarray], rows: int) -> bool:
    """Does the one-node graph compute some row alone (T = 1) otherwise than inside the call of all
    `rows` rows?"""
    from edgespec.engines.ort import model_session

    graph = helper.make_graph([node], "probe", inputs, outputs, initializer=inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", LEAN_OPSET), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    sess = model_session(model.SerializeToString())
    wide = sess.run(None, feeds)[0]
    return any(
        not np.array_equal(sess.run(None, {k: v[:, i : i + 1] for k, v in feeds.items()})[0][0, 0], wide[0, i])
        for i in range(rows)
    )


def one_row_int4_differs(block_size: int = 32, accuracy_level: int = 4, k: int = 576, n: int = 256) -> bool:
    """Does this CPU's ONNX Runtime compute a 1-row int4 MatMulNBits differently from the same row
    inside a wider call? (ORT 1.32 on an AVX2-only EPYC: yes, by ~1e-6, which flips greedy tokens
    after a while; on an AVX-512 EPYC: no; docs/results/two-row-decode.md.)
    Random weights and rows, a few tries."""
    from edgespec.engines.ort import model_session

    rng = np.random.default_rng(0)
    codes, scales, zp, _ = quantize_int4(rng.standard_normal((n, k)).astype(np.float32), block_size)
    node = helper.make_node(
        "MatMulNBits",
        ["x", "w", "s", "z"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block_size,
        accuracy_level=accuracy_level,
    )
    inits = [
        helper.make_tensor(name, NP_TO_ONNX[a.dtype], a.shape, a.tobytes(), raw=True)
        for name, a in (("w", codes), ("s", scales), ("z", zp))
    ]
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    )
    sess = model_session(model.SerializeToString())
    x = rng.standard_normal((8, k)).astype(np.float32)
    wide = sess.run(None, {"x": x})[0]
    return any(not np.array_equal(sess.run(None, {"x": x[i : i + 1]})[0][0], wide[i]) for i in range(len(x)))
