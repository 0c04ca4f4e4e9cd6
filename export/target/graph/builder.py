"""What every graph writer builds with: the options a graph is written with (GraphOptions), the
builder of one graph's nodes and constants (GraphBuilder) and its initializers pointing into a
weights file (external_initializers)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgespec.engines import rope
from edgespec.export.target.graph.store import WeightStore

OPSET = 17


TOP_K = 8  # next-token candidates per row a decoder graph outputs beside its logits (GraphOptions.top_k)


NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,  # an embedding every value of which is a bf16
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
}


@dataclass(frozen=True)
class GraphOptions:
    precision: str  # "fp32" | "fp16" | "int4": weights (int4: MatMulNBits, fp32 activations)
    int4_block_size: int = 32  # weights per quantization block along the input dimension
    int4_accuracy_level: int = 4  # MatMulNBits accuracy_level (4 = int8 activations, 0 = fp32)
    int4_lm_head: bool = False  # quantize the LM head too (smaller, faster, worse text)
    int8_lm_head: bool = True  # int4 precision: the LM head as 8-bit MatMulNBits (GGUF's Q8_0 scheme;
    #                            streams a quarter of the fp32 bytes); False: fp32 Gemm on the embedding
    trees: bool = False  # tree_mask input + tree attention (2 more ops per layer, one of them T wide);
    #                      off, the graph serves chains only
    aux_layers: tuple[int, ...] = ()  # also output hidden_aux [1, T, n*H]: the residual stream entering
    #                                   these layers, concatenated (EAGLE-3's low/mid/high features)
    two_row_matmuls: bool = False  # int4: a 1-token call runs the layers' matmuls on 2 rows (a zero row
    #                                added), for CPUs whose 1-row int4 kernel sums differently from the
    #                                n-row one (ORT 1.32 on AVX2): decode rows then equal verify rows bitwise
    flavour: str = "portable"  # the layer ops (FLAVOURS): "portable": standard ONNX ops (TensorRT parses it);
    #                            "lean": ORT contrib ops where they keep the rule, fewer nodes per layer
    portable_ops: tuple[str, ...] = ()  # lean: fused ops written in their portable form instead (the
    #                                     export's probe found they break the rule here, or forced): any of
    #                                     lean.LEAN_OPS
    host_prologue: bool = False  # lean target/draft graphs: the per-call masks and indices come in as inputs
    #                              the engine builds (lean_prologue.host_prologue_inputs), no shape arithmetic in
    #                              the graph, so ONNX Runtime's CUDA graphs can capture it; heads keep theirs
    int4_kernel: str = "nbits"  # int4 linears: "nbits" (ONNX Runtime's MatMulNBits) or "rowop" (edgespec's
    #                             row kernel, a custom op: linears.RowLinears, engines/rowop)
    top_k: int = TOP_K  # target/draft graphs of the ONNX Runtime flavours also output each row's top_k next
    #                     tokens (topk_ids) and their probabilities (topk_probs), read off the logits output
    #                     (which stays bitwise the same): the recycle drafter's table, and the argmax a greedy
    #                     verify accepts from (ids only leave the GPU). 0: none

    @property
    def writes_top_k(self) -> int:
        """The top-k a decoder graph written with these options outputs (0: none). Portable graphs
        have none: native TensorRT binds every output of its engines, and build-trt's have three."""
        return self.top_k if self.flavour != "portable" else 0


def external_initializers(
    names,
    store: WeightStore,
    weights_location: str,
    offsets: dict[str, int],
    locations: dict[str, tuple[str, int, np.ndarray]] | None = None,
) -> list[TensorProto]:
    """Initializers of the named weights, each pointing at its bytes in a weights file: the model's
    own (`offsets` into `weights_location`) or another model's (`locations`: name -> (file,
    offset, array of the same dtype and shape))."""
    inits = []
    for name in sorted(names):
        file, offset, arr = (locations or {}).get(name) or (weights_location, offsets[name], store.arrays[name])
        if rope.rope_of(arr) is not None:  # computed at load: the note file, so other readers fail loudly
            file, offset = rope.COMPUTED_FILE, 0
        t = TensorProto(name=name, data_type=NP_TO_ONNX[arr.dtype], dims=arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, val in (("location", file), ("offset", str(offset)), ("length", str(arr.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, val
        inits.append(t)
    return inits


def _axes_as_attributes(b: GraphBuilder) -> None:
    """ReduceMax nodes written with their axes as an input (opset 18) take them as an attribute
    instead, for a graph of an older opset (the integer linears' row quantization is written once
    for every flavour)."""
    consts = {c.name: c for c in b.consts}
    for node in b.nodes:
        if node.op_type == "ReduceMax" and len(node.input) == 2 and node.input[1] in consts:
            axes = numpy_helper.to_array(consts[node.input[1]]).tolist()
            del node.input[1]
            node.attribute.append(helper.make_attribute("axes", axes))


class GraphBuilder:
    """The nodes, constants and used weights of one graph being written."""

    def __init__(self, store: WeightStore, dtype: np.dtype) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []
        self.store = store
        self.used_weights: set[str] = set()
        self.dtype = dtype
        self._const_names: set[str] = set()
        self.memo: dict[tuple, object] = {}  # what this graph computes once per input (linears: quantized rows,
        #                                      block sums); on the builder, so no other graph can hit it

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, domain: str = "", **attrs):
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain or None, **attrs))
        return outs if n_out > 1 else outs[0]

    def const(self, name: str, arr: np.ndarray) -> str:
        """A constant initializer, added once per name (layers share them)."""
        if name in self._const_names:
            return name
        self._const_names.add(name)
        self.consts.append(helper.make_tensor(name, NP_TO_ONNX[arr.dtype], arr.shape, arr.flatten().tolist()))
        return name

    def weight(self, name: str) -> str:
        self.used_weights.add(name)
        return name
