"""The integer precision's linears: int8 weights x int8 activation rows, exact int32 sums."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto

from edgespec.export.target.quant.linears import Linears, Origin, Part

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphBuilder, GraphOptions
    from edgespec.export.target.graph.store import WeightStore


class IntegerLinears(Linears):
    """int8 weights x int8 activation rows with exact int32 accumulation (precision "int8").

    Weights: symmetric per output channel, w ~ q_w * s_w (q_w in [-127, 127], s_w = max|w_row| / 127).
    Activations: each row r of x quantized on its own, s_r = max(max|x_r| / 127, tiny), stored as
    u8 = round(x_r / s_r) + 128 (ONNX Runtime's fast integer GEMM reads unsigned activations and
    signed weights). Then y_rn = s_r * (s_w[n] * sum_k (u8_rk - 128) q_w[kn]): the sum is an exact
    int32 and every factor depends on row r alone, so a row's output is the same bits whatever
    other rows share the call (decode, verify and prefill agree by arithmetic). The row
    quantization of one input is written once and shared by every linear that reads it."""

    def __init__(self, opts: GraphOptions, dtype: np.dtype, store: WeightStore) -> None:
        super().__init__(opts, dtype, store)

    def bits(self, name: str) -> int:
        return 8

    def store_linear(
        self, name: str, w_out_in: np.ndarray, tied: bool = False, parts: tuple[Part, ...] = ()
    ) -> np.ndarray:
        self.shapes[name] = w_out_in.shape
        for p in parts or (Part(name, w_out_in.shape[0], "float"),):
            self.origins.append(Origin(p.hf_name, p.source, "int8 per channel (re-quantized)", False))
        w = np.asarray(w_out_in, np.float32)
        scale = np.abs(w).max(axis=1) / 127.0  # [N]
        scale[scale == 0] = 1.0  # an all-zero output channel
        q = np.clip(np.rint(w / scale[:, None]), -127, 127)  # [N, K]
        self.store.add(f"{name}.i8", np.ascontiguousarray(q.T).astype(np.int8))  # [K, N]
        self.store.add(f"{name}.wscale", scale.astype(np.float32))
        return (q * scale[:, None]).astype(np.float32)

    def _quantized_rows(self, b: GraphBuilder, x: str) -> tuple[str, str]:
        """x [.., K] float -> (u8 rows [.., K], row scales [.., 1]): 7 nodes, once per input."""
        key = ("rowq", x)  # once per input of this graph
        if key not in b.memo:
            p = f"{x}/rowq"
            amax = b.op(
                "ReduceMax",
                [b.op("Abs", [x], p + "/abs"), b.const("rowq_axis", np.array([-1], np.int64))],
                p + "/amax",
                keepdims=1,
            )
            inv127, tiny = (
                b.const("rowq_inv127", np.array(1 / 127, np.float32)),
                b.const("rowq_tiny", np.array(1e-30, np.float32)),
            )
            scale = b.op("Max", [b.op("Mul", [amax, inv127], p + "/div127"), tiny], p + "/scale")
            rounded = b.op("Round", [b.op("Div", [x, scale], p + "/div")], p + "/round")
            offset = b.const("rowq_offset", np.array(128, np.float32))
            u8 = b.op("Cast", [b.op("Add", [rounded, offset], p + "/offset")], p + "/u8", to=TensorProto.UINT8)
            b.memo[key] = (u8, scale)
        return b.memo[key]

    def linear(self, b: GraphBuilder, x: str, name: str, stream_3d: bool = False) -> str:
        u8, row_scale = self._quantized_rows(b, x)
        y = b.op(
            "MatMulIntegerToFloat",
            [
                u8,
                b.weight(f"{name}.i8"),
                b.const("rowq_one", np.array(1, np.float32)),
                b.weight(f"{name}.wscale"),
                b.const("rowq_zp", np.array(128, np.uint8)),
            ],
            name + "/MatMulIntegerToFloat",
            domain="com.microsoft",
        )  # [.., N] = s_w[n] * exact int32
        return b.op("Mul", [y, row_scale], name + "/row_scale")
