"""The fused target+EAGLE graph's manifest entry: the target graph's I/O with the head's appended
under FUSED_PREFIX (the graph itself: graph.fuse_with_target; the runtime's side:
runtime/drafters/eagle/fused.py)."""

from __future__ import annotations

from dataclasses import replace

from edgespec.engines.manifest import FUSED_PREFIX, TOKENS, GraphSpec, ModelSpec, TensorSpec


def fused_graph(file: str, target: GraphSpec, head: GraphSpec) -> GraphSpec:
    """The target graph with the EAGLE head appended (graph.fuse_with_target): the target's
    I/O, then the head's token ids, the count of rows given them, its cache and its outputs, all
    under FUSED_PREFIX."""
    p = FUSED_PREFIX
    inputs = target.inputs + (
        TensorSpec(p + "input_ids", (1, TOKENS), "int64"),
        TensorSpec(p + "n_given", (1,), "int64"),
    )
    inputs += tuple(replace(t, name=p + t.name) for t in head.inputs if t.layers)  # the head's own cache
    outputs = target.outputs + tuple(replace(t, name=p + t.name) for t in head.outputs)
    return replace(target, file=file, inputs=inputs, outputs=outputs)


def fused_spec(file: str, target: ModelSpec, head: ModelSpec) -> ModelSpec:
    """The fused graph's entry: the target's, on the same weights files, plus the head's weights
    under FUSED_PREFIX (in the head's file unless they name their own)."""
    weights = target.weights | {
        FUSED_PREFIX + k: replace(w, file=w.file or head.weights_file) for k, w in head.weights.items()
    }
    return replace(
        target,
        role="eagle_fused",
        kind="target+eagle",
        weights=weights,
        graph=fused_graph(file, target.graph, head.graph),
    )
