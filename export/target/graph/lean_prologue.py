"""The lean flavour's per-call prologue: the masks, indices and rotary rows every layer's attention
shares (lean.LeanOps.attention reads them from ctx), built once per call in the graph, or read
from graph inputs the engine builds (--host-prologue: engines/prologue.py writes the same values).

Rows are ordered (t, h): row t*Hq + h is query head h of token t. A model with sliding layers
(arch.sliding_layers, Gemma 3) gets their own entries under ctx["sliding"] (layer_ops.LayerOps.layer_ctx):
the masks with the key window applied when it is shorter than max_len, the rotary tables of their
own base where it differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphBuilder
    from edgespec.export.target.graph.lean import LeanOps


def host_prologue_inputs(
    n_heads: int, dtype: str, trees: bool, two_rows: bool, window: bool = False
) -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of the inputs a --host-prologue graph takes instead of computing them
    (T: the call's width, S: the cache window, S >= past_len + T). Per-head rows come as [T, Hq, W]
    (row t*Hq + h of the prologue once flattened): the manifest's shapes are ints, T and S.
    window: the model has a key window (arch.sliding_window): its sliding layers' two masks too."""
    out = [
        ("mask_past", (1, "S"), dtype),
        ("mask_new", ("T", n_heads, "T"), dtype),
        ("score_cols", ("T", n_heads, "T"), "int64"),
    ]
    if window:  # a row's own past: the window's start differs per row
        out += [("mask_past_local", ("T", n_heads, "S"), dtype), ("mask_new_local", ("T", n_heads, "T"), dtype)]
    if trees:
        out.append(("to_node", ("T", n_heads, "S"), "int64"))
    out.append(("value_slots", (1, "T", 1), "int64"))
    if two_rows:  # Pad's pads and Slice's end: read on the host by ONNX Runtime's kernels, fixed per width
        out += [("two_rows_pads", (6,), "int64"), ("n_rows", (1,), "int64")]
    return out


def graph_prologue(ops: LeanOps, b: GraphBuilder) -> dict:
    """The prologue computed in the graph (LeanOps.prologue lists what it holds)."""
    t_len = b.op("Gather", [b.op("Shape", ["input_ids"], "/T/shape"), "axis1"], "/T/T")  # [1]
    s_len = b.op("Gather", [b.op("Shape", ["past_key_0"], "/S/shape"), "axis0"], "/S/S")  # [1]
    j_idx = b.op("Range", ["zero_i", b.op("Squeeze", [s_len], "/S/scalar"), "one_i"], "/S/slots")  # [S]
    t_idx = b.op("Range", ["zero_i", b.op("Squeeze", [t_len], "/T/scalar"), "one_i"], "/T/rows")  # [T]
    pos = b.op("Reshape", ["positions", b.const("shape_T", np.array([-1], np.int64))], "/pos_flat")  # [T]
    cached = b.op("Less", [j_idx, "past_len"], "/mask/cached")  # [S]
    mask_past = b.op(
        "Unsqueeze", [b.op("Where", [cached, "zero_f", "ninf_f"], "/mask/past_bias"), "axis0"], "/mask/past"
    )  # [1, S]
    at = _placement(ops, b, t_idx, pos, s_len)
    ctx = {
        "t_len": t_len,
        "mask_past": mask_past,
        "mask_new": _per_head(b, at["mask_new"], t_len, "/mask/new"),
        "cols": _per_head(b, at["cols"], t_len, "/cols"),
    }
    if ops.arch.sliding_window:  # sliding layers: a key at position j is seen from position p only if p - j < window
        ctx["sliding"] = _window_masks(ops, b, at, cached, j_idx, t_len, s_len)
    if ops.opts.trees:
        ctx["to_node"] = _to_node(b, at["cols"], j_idx, t_len, s_len)
    _value_slots(ops, b, ctx, t_idx, t_len, s_len)
    return rope_rows(ops, b, ctx)


def _per_head(b: GraphBuilder, x: str, width: str, name: str) -> str:
    """[T, W] -> [T*Hq, W]: row t*Hq + h is row t."""
    tiled = b.op("Tile", [b.op("Unsqueeze", [x, "axis1"], name + "/unsq"), "tile_heads"], name + "/tile")
    shape = b.op("Concat", [b.const("minus_1", np.array([-1], np.int64)), width], name + "/shape", axis=0)
    return b.op("Reshape", [tiled, shape], name + "/rows")


def _placement(ops: LeanOps, b: GraphBuilder, t_idx: str, pos: str, s_len: str) -> dict:
    """Where each row's new keys go: anc [T, T] (column node c is row node r or an ancestor; a
    chain: c <= r), its mask mask_new [T, T], the window column each new key's score takes, cols
    [T, T] (an ancestor's at its position, a non-ancestor's after the row's), and the positions as
    a column (pos_col [T, 1]) and a row (pos_row [1, T])."""
    row_t = b.op("Unsqueeze", [t_idx, "axis0"], "/T/row")  # [1, T]
    if ops.opts.trees:  # 1 where column node c is row node r or one of its ancestors
        anc = b.op("Cast", ["tree_mask"], "/tree/anc", to=TensorProto.BOOL)
    else:  # a chain: c <= r
        anc = b.op("LessOrEqual", [row_t, b.op("Unsqueeze", [t_idx, "axis1"], "/T/col")], "/chain/anc")
    mask_new = b.op("Where", [anc, "zero_f", "ninf_f"], "/mask/new_bias")  # [T, T]
    # non-ancestor c of row r goes to column pos[r] + 1 + (its rank among r's non-ancestors)
    n_anc_before = b.op(
        "CumSum",
        [b.op("Cast", [anc], "/cols/anc_i", to=TensorProto.INT64), "one_i"],
        "/cols/anc_before",
        exclusive=1,
    )  # [T, T]
    pos_col = b.op("Unsqueeze", [pos, "axis1"], "/cols/pos_col")  # [T, 1]
    pos_row = b.op("Unsqueeze", [pos, "axis0"], "/cols/pos_row")  # [1, T]
    after_row = b.op("Add", [pos_col, b.op("Add", [row_t, "one_i"], "/cols/c_plus_1")], "/cols/after_row")
    non_anc = b.op("Sub", [after_row, n_anc_before], "/cols/non_anc")
    cols = b.op("Where", [anc, pos_row, non_anc], "/cols/chain")
    last_slot = b.op("Sub", [s_len, "one_i"], "/S/last")
    cols = b.op("Min", [cols, last_slot], "/cols/in_window")  # [T, T]
    return {"anc": anc, "mask_new": mask_new, "cols": cols, "pos_col": pos_col, "pos_row": pos_row}


def _window_masks(ops: LeanOps, b: GraphBuilder, at: dict, cached: str, j_idx: str, t_len: str, s_len: str) -> dict:
    """The sliding layers' masks: a row sees a key at position j only if its position p - j < window."""
    first = b.op(
        "Sub", [at["pos_col"], b.const("window_m1", np.array(ops.arch.sliding_window - 1, np.int64))], "/window/first"
    )  # [T, 1]: the row's first visible position
    j_row = b.op("Unsqueeze", [j_idx, "axis0"], "/window/j_row")  # [1, S]
    past_in = b.op(
        "And",
        [
            b.op("Unsqueeze", [cached, "axis0"], "/window/cached"),
            b.op("GreaterOrEqual", [j_row, first], "/window/ge"),
        ],
        "/window/past_in",
    )  # [T, S]
    new_in = b.op(
        "And", [at["anc"], b.op("GreaterOrEqual", [at["pos_row"], first], "/window/new_ge")], "/window/new_in"
    )
    past_bias = b.op("Where", [past_in, "zero_f", "ninf_f"], "/window/past_bias")
    mask_past = _per_head(b, past_bias, s_len, "/window/past")
    new_bias = b.op("Where", [new_in, "zero_f", "ninf_f"], "/window/new_bias")
    return {"mask_past": mask_past, "mask_new": _per_head(b, new_bias, t_len, "/window/new")}


def _to_node(b: GraphBuilder, cols: str, j_idx: str, t_len: str, s_len: str) -> str:
    """A tree's probabilities back to node order: slot past_len + c <- column cols[r, c] (per head)."""
    rest = b.op("Sub", [b.op("Sub", [s_len, "past_len"], "/to_node/rest"), t_len], "/to_node/after")
    pads = b.op("Concat", ["zero_1", "past_len", "zero_1", rest], "/to_node/pads", axis=0)
    rel = b.op("Sub", [j_idx, "past_len"], "/to_node/rel")
    is_new = b.op(
        "And",
        [b.op("GreaterOrEqual", [rel, "zero_i"], "/to_node/ge"), b.op("Less", [rel, t_len], "/to_node/lt")],
        "/to_node/is_new",
    )
    to_node = b.op(
        "Where",
        [
            b.op("Unsqueeze", [is_new, "axis0"], "/to_node/is_new_row"),
            b.op("Pad", [cols, pads], "/to_node/place"),
            b.op("Unsqueeze", [j_idx, "axis0"], "/to_node/identity"),
        ],
        "/to_node/T",
    )
    return _per_head(b, to_node, s_len, "/to_node")


def _value_slots(ops: LeanOps, b: GraphBuilder, ctx: dict, t_idx: str, t_len: str, s_len: str) -> None:
    """Into ctx: the new values' slots in the window (n_in of them: v_slots) and, for two-row int4
    calls, the pads adding rows below a [1, T, W] activation so MatMulNBits sees max(T, 2) rows."""
    n_in = b.op("Min", [t_len, b.op("Sub", [s_len, "past_len"], "/v/room")], "/v/n_in")  # [1]
    slots = b.op("Slice", [b.op("Add", [t_idx, "past_len"], "/v/slots_all"), "zero_1", n_in], "/v/slots_in")
    ctx["n_in"] = n_in
    ctx["v_slots"] = b.op("Unsqueeze", [slots, b.const("axes_0_2", np.array([0, 2], np.int64))], "/v/slots")
    if ops.opts.two_row_matmuls and ops.opts.precision == "int4":
        extra = b.op(
            "Max",
            [b.op("Sub", [b.const("two_1", np.array([2], np.int64)), t_len], "/two_rows/sub"), "zero_1"],
            "/two_rows/extra",
        )
        ctx["two_rows"] = b.op(
            "Concat", ["zero_1", "zero_1", "zero_1", "zero_1", extra, "zero_1"], "/two_rows/pads", axis=0
        )


def host_prologue(ops: LeanOps, b: GraphBuilder) -> dict:
    """The prologue's outputs read from graph inputs (host_prologue_inputs): no Shape, Range, CumSum
    or data-dependent Slice, so ONNX Runtime places nothing of it on the host and a CUDA graph can
    capture the call."""
    ctx = {"mask_past": "mask_past", "v_slots": "value_slots"}
    heads = [("mask_new", "mask_new"), ("score_cols", "cols")]
    if ops.opts.trees:
        heads.append(("to_node", "to_node"))
    for name, key in heads:  # input [T, Hq, W] -> the prologue's [T*Hq, W]
        ctx[key] = b.op("Flatten", [name], f"/{key}/rows", axis=2)
    if ops.arch.sliding_window:
        ctx["sliding"] = {
            key: b.op("Flatten", [key + "_local"], f"/window/{key}_rows", axis=2) for key in ("mask_past", "mask_new")
        }
    if ops.opts.two_row_matmuls and ops.opts.precision == "int4":
        ctx["two_rows"], ctx["t_len"] = "two_rows_pads", "n_rows"
    return rope_rows(ops, b, ctx)


def row_prologue(ops: LeanOps, b: GraphBuilder) -> dict:
    """The prologue of a graph whose attention is edgespec's op (LeanOps.row_attention): the op reads
    past_len and tree_mask and builds each row's keys itself, so only the rotary rows, and the
    sliding layers' key window (ctx["sliding"]["window"], their attention's attribute)."""
    ctx: dict = {}
    if ops.arch.sliding_window:
        ctx["sliding"] = {"window": int(ops.arch.sliding_window)}
    return rope_rows(ops, b, ctx)


def rope_rows(ops: LeanOps, b: GraphBuilder, ctx: dict) -> dict:
    """ctx with the rotary inputs: the fused RotaryEmbedding reads its caches by name (rope_suffix
    picks the sliding layers' own); the portable rotation, cos/sin rows of the positions gathered
    once: [1, T, 1, D]."""
    local = bool(ops.arch.local_rope)
    if local:
        ctx["sliding"] = ctx.get("sliding", {}) | {"rope_suffix": "_local"}
    if not ops._fused("rotary"):
        for suffix, into in [("", ctx)] + ([("_local", ctx["sliding"])] if local else []):
            for name in ("cos", "sin"):
                rows = b.op(
                    "Gather", [b.weight(f"rope_{name}{suffix}"), "positions"], f"/rope{suffix}/{name}"
                )  # [1, T, D]
                into[name] = b.op("Unsqueeze", [rows, "axis2"], f"/rope{suffix}/{name}_unsq")
    return ctx
