"""The op choices of a graph flavour, as one strategy every model declaration calls.

A model (graph.LlamaGraphWriter, each drafter's graph writer) is written once as
calls on a LayerOps: `linear`, `norm`, `add`, `rotary`, `attention`, `mlp` and the per-call
prologue. Each flavour implements them in its own ops and tensor layout:
  portable (portable.PortableOps)  standard ONNX ops, opset 17, rows [T, H]: TensorRT parses it
  lean (lean.LeanOps)              ONNX Runtime's fused ops where they keep the rule, opset 18,
                                         rows [1, T, H], a sublayer's output added by the next norm
The linears are a strategy of their own (linears.Linears, the flavour's LINEARS), so a flavour
with other linears only names another class. Graphs whose layers exist in one form only (a block
drafter's attention, multi-token heads' blocks) take `standard()`: this flavour's linears, portable
layer ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgespec.export.target.quant.linears import Linears

if TYPE_CHECKING:
    from onnx import ValueInfoProto

    from edgespec.export.target.arch import ArchSpec
    from edgespec.export.target.graph.builder import GraphBuilder, GraphOptions

MLP_NAMES = ("Split", "Sigmoid", "SiLU", "GLU")  # node names of mlp()'s ops under its prefix
GEMM_K_MAX = 128  # longest attention-score reduction one Gemm takes (LayerOps.scores)


@dataclass(frozen=True)
class Stream:
    """The residual stream of a graph: x, plus a sublayer output not yet added to it (the lean
    flavour's next norm adds it in one fused op; the portable flavour adds at once)."""

    x: str
    delta: str | None = None


class LayerOps:
    """One flavour's ops for one model (its arch, options and weights). Subclasses implement the
    layout-dependent methods below; the rest is shared."""

    LINEARS: type[Linears] = Linears  # how this flavour stores and multiplies linear layers
    OPSET = 17  # default-domain opset of the graphs
    STREAM_3D = False  # rows are [1, T, W] (else [T, W])
    half_cache = False  # the graph also reads an fp16 cache (KV16_TEMPLATE inputs; graph.LlamaGraphWriter.build)

    def __init__(self, arch: ArchSpec, opts: GraphOptions, dtype: np.dtype, linears: Linears) -> None:
        self.arch = arch
        self.opts = opts
        self.dtype = dtype
        self.linears = linears
        self.store = linears.store

    def standard(self) -> LayerOps:
        """This flavour's linears with the portable layer ops (graphs written in standard ops only)."""
        from edgespec.export.target.graph.portable import PortableOps

        return PortableOps(self.arch, self.opts, self.dtype, self.linears)

    # ---- shared ---------------------------------------------------------------------------------
    def linear(self, b: GraphBuilder, x: str, name: str) -> str:
        """x times the stored linear layer `name` (linears.Linears.linear)."""
        return self.linears.linear(b, x, name, stream_3d=self.STREAM_3D)

    def rms_norm(self, b: GraphBuilder, x: str, weight: str, name: str, axes: str | None = None) -> str:
        """y = x / sqrt(mean(x^2) + eps) * w in standard ops (the pattern ORT fuses into
        SimplifiedLayerNormalization). axes: an input naming the reduced axis (opset >= 18); None:
        the opset-17 attribute."""
        sq = b.op("Pow", [x, "two"], name + "/Pow")
        if axes:
            mean = b.op("ReduceMean", [sq, axes], name + "/ReduceMean", keepdims=1)
        else:
            mean = b.op("ReduceMean", [sq], name + "/ReduceMean", axes=[-1], keepdims=1)
        var = b.op("Add", [mean, "eps"], name + "/Add")
        std = b.op("Sqrt", [var], name + "/Sqrt")
        normed = b.op("Div", [x, std], name + "/Div")
        return b.op("Mul", [normed, b.weight(weight)], name + "/Mul")

    def silu(self, b: GraphBuilder, x: str, sigmoid_name: str, name: str) -> str:
        """x * sigmoid(x)."""
        return b.op("Mul", [x, b.op("Sigmoid", [x], sigmoid_name)], name)

    def gelu_tanh(self, b: GraphBuilder, x: str, name: str) -> str:
        """GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in standard ops
        (opset 17 has no Gelu)."""
        f = self.dtype
        cube = b.op("Mul", [b.op("Mul", [x, x], name + "/x2"), x], name + "/x3")
        inner = b.op(
            "Add", [x, b.op("Mul", [cube, b.const("gelu_k", np.array(0.044715, f))], name + "/kx3")], name + "/in"
        )
        t = b.op(
            "Tanh",
            [b.op("Mul", [inner, b.const("gelu_c", np.array(np.sqrt(2 / np.pi), f))], name + "/cx")],
            name + "/Tanh",
        )
        half_x = b.op("Mul", [x, b.const("gelu_half", np.array(0.5, f))], name + "/half_x")
        return b.op("Mul", [half_x, b.op("Add", [t, b.const("gelu_one", np.array(1.0, f))], name + "/one_t")], name)

    def gate_act(self, b: GraphBuilder, x: str, sigmoid_name: str, name: str) -> str:
        """The MLP gate's activation (arch.mlp_act): silu, or GELU's tanh approximation (Gemma)."""
        if self.arch.mlp_act == "gelu_tanh":
            return self.gelu_tanh(b, x, name)
        return self.silu(b, x, sigmoid_name, name)

    def layer_ctx(self, ctx: dict, i: int) -> dict:
        """The prologue's ctx as layer i's attention reads it: a sliding layer's (arch.sliding_layers)
        rotary rows and masks in place of the global ones (the prologue's ctx["sliding"])."""
        if i in self.arch.sliding_layers and "sliding" in ctx:
            return ctx | ctx["sliding"]
        return ctx

    def mlp(
        self, b: GraphBuilder, i: int, h: str, name: str, names: tuple[str, ...] = MLP_NAMES, sized: bool = True
    ) -> str:
        """Gated MLP of layer i: down(act(gate) * up) (act: gate_act, SwiGLU's silu or Gemma's GELU),
        gate and up one packed linear; returns its output (not yet added to the stream). names: its
        Split, Sigmoid, activation and product nodes under `name`; sized: the Split names its sizes
        (else: two equal halves)."""
        split, sigmoid, silu, glu = (f"{name}/{n}" for n in names)
        gu = self.linear(b, h, f"l{i}.gate_up")
        n_inner = self.arch.intermediate_size
        sizes = [b.const(self._gate_up_split(i), np.array([n_inner] * 2, np.int64))] if sized else []
        g, u = b.op("Split", [gu, *sizes], split, n_out=2, axis=-1)
        act_name = silu if self.arch.mlp_act == "silu" else f"{name}/GeluTanh"
        act = b.op("Mul", [self.gate_act(b, g, sigmoid, act_name), u], glu)
        return self.linear(b, act, f"l{i}.down")

    def scores(self, b: GraphBuilder, q: str, keys: str, mask: str | None, name: str) -> str:
        """q [M, Hkv*D] . keys [N, Hkv*D]^T * attn_scale (+ mask [M, N] or broadcastable): one Gemm, or one
        per GEMM_K_MAX columns summed in order where the rows are wider.

        Why: ONNX Runtime's CPU Gemm (MLAS) splits a reduction longer than 128 into passes at places
        that depend on N (measured on ORT 1.32, AMD EPYC Zen 4: K = 192 or 256 gives other bits at
        N >= 192 than at N = 2), and the new keys' scores (N = T) must be the bits the cached keys'
        (N = the window) give in a later call. A reduction of <= 128 is one pass for every M >= 2 and
        N (tests/test_lean_graph.py probes it), and the chunks' partial scores are added in a fixed order."""
        width = self.arch.n_kv_heads * self.arch.head_dim
        extra = [mask] if mask is not None else []
        if width <= GEMM_K_MAX:
            return b.op("Gemm", [q, keys, *extra], name, transB=1, alpha=self.arch.attn_scale)
        out = None
        axis = b.const("gemm_k_axis", np.array([1], np.int64))
        for c, lo in enumerate(range(0, width, GEMM_K_MAX)):
            hi = min(lo + GEMM_K_MAX, width)
            start, end = (
                b.const(f"gemm_k_{lo}", np.array([lo], np.int64)),
                b.const(f"gemm_k_{hi}", np.array([hi], np.int64)),
            )
            qc = b.op("Slice", [q, start, end, axis], f"{name}/q{c}")
            kc = b.op("Slice", [keys, start, end, axis], f"{name}/k{c}")
            part = b.op(
                "Gemm", [qc, kc, *(extra if c == 0 else [])], f"{name}/Gemm{c}", transB=1, alpha=self.arch.attn_scale
            )
            out = part if out is None else b.op("Add", [out, part], f"{name}/sum{c}")
        return out

    def pad_rows(self, b: GraphBuilder, ctx: dict, x: str, name: str) -> str:
        """Two-row calls: x with the zero row added below (MatMulNBits then sees 2 rows)."""
        return b.op("Pad", [x, ctx["two_rows"]], name) if "two_rows" in ctx else x

    def extra_inputs(self) -> list[ValueInfoProto]:
        """Graph inputs the prologue reads besides the token I/O (none here)."""
        return []

    # ---- per flavour ----------------------------------------------------------------------------
    def _gate_up_split(self, i: int) -> str:
        """The name of layer i's gate/up split sizes constant."""
        raise NotImplementedError

    def store_tables(self) -> None:
        """Store the rotary tables this flavour's graphs read (only those go into the weights file)."""
        raise NotImplementedError

    def prologue(self, b: GraphBuilder) -> dict:
        """Constants and the per-call masks, indices and rotary rows every layer shares (ctx)."""
        raise NotImplementedError

    def embed(self, b: GraphBuilder) -> str:
        """The embedding rows of input_ids."""
        raise NotImplementedError

    def rows_in(self, b: GraphBuilder, name: str, width: int, node: str) -> str:
        """A [1, T, width] graph input in this flavour's row layout."""
        raise NotImplementedError

    def real_rows(self, b: GraphBuilder, ctx: dict, y: str, name: str) -> str:
        """Two-row calls: y without the zero row pad_rows added."""
        raise NotImplementedError

    def norm(self, b: GraphBuilder, s: Stream, weight: str, name: str) -> tuple[str, Stream]:
        """RMSNorm of the stream (its pending output added first); returns (normed, the stream)."""
        raise NotImplementedError

    def add(self, b: GraphBuilder, s: Stream, y: str, name: str) -> Stream:
        """The stream with a sublayer's output y added (at once, or by the next norm)."""
        raise NotImplementedError

    def resolve(self, b: GraphBuilder, s: Stream, name: str) -> Stream:
        """The stream with its pending output added (node `name`), nothing pending."""
        raise NotImplementedError

    def out_norm(self, b: GraphBuilder, ctx: dict, s: Stream, weight: str, name: str) -> str:
        """The final norm of the stream's real rows (a two-row call's zero row dropped)."""
        raise NotImplementedError

    def rotary(self, b: GraphBuilder, x: str, n_heads: int, ctx: dict, name: str) -> str:
        """x rotated by the positions (HF rotate_half convention), x in this flavour's head layout
        (portable [T, heads, D] with ctx cos/sin [T, 1, D]; lean [1, T, heads*D])."""
        raise NotImplementedError

    def attention(self, b: GraphBuilder, i: int, h: str, ctx: dict) -> tuple[str, str, str]:
        """Layer i's GQA attention of h over the cache window with the new rows in place; returns
        (output after o_proj, new k rows, new v rows)."""
        raise NotImplementedError

    def kv_rows(self, b: GraphBuilder, k: str, v: str, name: str) -> list[str]:
        """The new k and v rows as new_kv's [1, T, Hkv*D] entries."""
        raise NotImplementedError
