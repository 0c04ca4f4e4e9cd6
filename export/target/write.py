"""Writing one model into the engine folder: its weights file and ONNX graph, returned as its
manifest entry. The target and draft decoders here (`write_model`, `host_prologue_entry`); each
drafter's graph module (<name>_graph.py, called by its export/drafters/ plugin) writes its own on
the helpers below: its files (`write_drafter`), the manifest entry of a token head
(`token_head_spec`), where it came from (`head_info`) and the folder a flag names (`heads_dir`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from edgespec.engines import rowop
from edgespec.engines.manifest import Architecture, HeadInfo, ModelSpec, WeightOrigin, WeightSpec
from edgespec.export.target import spec as es
from edgespec.export.target.graph.store import write_weights
from edgespec.export.target.graph.writer import LlamaGraphWriter, ModelWriter

SHIPPED_HEADS = Path(__file__).parents[1] / "heads"  # trained drafter heads shipped for default models


def _external(model: onnx.ModelProto) -> set[str]:
    """Names of the initializers the graph reads from its weights file."""
    return {i.name for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}


def write_model(
    writer: LlamaGraphWriter,
    folder: Path,
    role: str,
    kind: str,
    widths: list[int],
    chunk: int,
    weights_file: str,
    index: dict,
) -> ModelSpec:
    """<role>.onnx, one graph fed at every width, reading `weights_file` (written by the caller:
    a self:N draft shares the target's)."""
    model = writer.build(weights_file, {name: e["offset"] for name, e in index.items()})
    fname = f"{role}.onnx"
    onnx.save(model, folder / fname)
    a, aux = writer.arch, writer.opts.aux_layers
    return token_spec(
        writer,
        role,
        kind,
        fname,
        widths,
        chunk,
        n_layers=writer.n_layers,
        vocab=a.vocab_size,
        aux_layers=tuple(aux),
        weights_file=weights_file,
        weights=es.weight_specs(index, _external(model)),
        aux_width=len(aux) * a.hidden_size,
        half_cache=writer.half_cache,
        weight_origins=weight_origins(writer.linears.origins),
        rowop_layout=rowop.LAYOUT_VERSION if getattr(writer.linears, "attrs", None) else 0,
    )


def token_spec(
    w: ModelWriter,
    role: str,
    kind: str,
    file: str,
    widths: list[int],
    chunk: int,
    *,
    n_layers: int,
    vocab: int,
    aux_layers: tuple[int, ...],
    weights_file: str,
    weights: dict[str, WeightSpec],
    features: bool = False,
    aux_width: int = 0,
    half_cache: bool = False,
    **extra,
) -> ModelSpec:
    """The manifest entry of a token graph (spec.token_graph's I/O) written by w: its first n_layers
    layers, vocab logits, reading `weights` of weights_file. extra: more ModelSpec fields."""
    a, kv_dtype = w.arch, w.dtype.name
    graph = es.token_graph(
        file,
        widths,
        chunk,
        n_layers=n_layers,
        kv_width=a.n_kv_heads * a.head_dim,
        hidden_size=a.hidden_size,
        vocab_size=vocab,
        kv_dtype=kv_dtype,
        trees=w.opts.trees,
        features=features,
        aux_width=aux_width,
        opts=w.opts,
        half_cache=half_cache,
    )
    arch = Architecture(**(a.to_manifest() | {"n_layers": n_layers, "vocab_size": vocab}), aux_layers=aux_layers)
    return ModelSpec(
        role=role,
        kind=kind,
        precision=w.opts.precision,
        arch=arch,
        kv_dtype=kv_dtype,
        weights_file=weights_file,
        weights=weights,
        graph=graph,
        **extra,
    )


def weight_origins(origins) -> tuple[WeightOrigin, ...]:
    """linears.Origin per weight -> one WeightOrigin per kind of weight (its name without the
    layer), source type and storage, in the order the kinds were first stored."""
    counts: dict[tuple, int] = {}
    for o in origins:
        parts = o.hf_name.removesuffix(".weight").split(".")
        kind = ".".join(parts[3:] if parts[:2] == ["model", "layers"] and parts[2].isdigit() else parts)
        key = (kind, o.source, o.stored, o.exact, o.why)
        counts[key] = counts.get(key, 0) + 1
    return tuple(WeightOrigin(k, src, stored, exact, n, why) for (k, src, stored, exact, why), n in counts.items())


def describe_origins(origins: tuple[WeightOrigin, ...]) -> list[str]:
    """The export's report: one line per kind of linear weight, kept ones first."""
    width = max((len(o.kind) for o in origins), default=0)
    lines = []
    for o in sorted(origins, key=lambda o: not o.exact):
        what = "kept" if o.exact else "re-quantized"
        why = f" ({o.why})" if o.why else ""
        lines.append(f"{what:>12} {o.kind:<{width}} {o.source:>6} x{o.tensors:<3} -> {o.stored}{why}")
    return lines


def host_prologue_entry(spec: ModelSpec, writer: LlamaGraphWriter) -> ModelSpec:
    """A target/draft entry whose graph was written with --host-prologue declares the prologue's inputs."""
    if not (writer.opts.host_prologue and writer.lean):  # the portable writer keeps its prologue
        return spec
    window = bool(writer.arch.sliding_window)
    return replace(spec, graph=es.with_host_prologue(spec.graph, writer.arch.n_heads, writer.opts, window))


def heads_dir(arg: str | None, src, suffix: str, kind: str) -> Path | None:
    """The drafting-head folder a drafter's flag (--<kind>) names: none, the shipped one for the
    default model (heads/<name><suffix>, with "auto"), or a folder."""
    if arg in (None, "none", ""):
        return None
    if arg == "auto":
        shipped = SHIPPED_HEADS / (src.name + suffix)
        return shipped if src.kind == "default" and (shipped / "config.json").exists() else None
    path = Path(arg)
    if not path.is_dir():
        raise es.ExportError(
            f"--{kind} {arg}: not a folder. Hint: train one with `edgespec train-{kind} "
            f"--out {arg}` or pass --{kind} none"
        )
    return path


def _trained(heads: Path, key: str) -> dict:
    """The training record a head checkpoint's config.json keeps under `key`."""
    return json.loads((heads / "config.json").read_text()).get(key, {})


def head_info(src: Path, target_vocab: int, trained_vocab: int, key: str) -> HeadInfo:
    """Where a drafter came from: its folder and the training record its config.json keeps under `key`."""
    return HeadInfo(
        source=str(src),
        target_vocab_size=target_vocab,
        trained_draft_vocab_size=trained_vocab,
        trained=_trained(src, key),
    )


@dataclass(frozen=True)
class DrafterFiles:
    """A drafter's <stem>.weights and <stem>.onnx, as its manifest entry names them."""

    stem: str  # file name without suffix: the drafter's name
    model: onnx.ModelProto  # the graph written
    index: dict[str, dict]  # the weights file's index (weights.write_weights)
    weights: dict[str, WeightSpec]  # the initializers the graph reads (a target's embedding: in target.weights)

    def spec(self, name: str) -> WeightSpec:
        """The entry of an array of the drafter's weights file (d2t, fc_t)."""
        return WeightSpec.from_json(self.index[name] | {"file": f"{self.stem}.weights"})


def write_drafter(
    w: ModelWriter,
    folder: Path,
    stem: str,
    extra: dict[str, np.ndarray],
    target: tuple[LlamaGraphWriter, dict] | None = None,
) -> DrafterFiles:
    """<stem>.weights (the writer's arrays and `extra`) and <stem>.onnx. target: (its writer, its
    weights index): the graph reads the target's embedding from target.weights in place."""
    index = write_weights(w.store.arrays | extra, folder / f"{stem}.weights")
    offsets = {k: v["offset"] for k, v in index.items()}
    if target is None:
        model = w.build(f"{stem}.weights", offsets)
    else:
        writer, index_t = target
        lin = writer.linears
        if "embed" in index_t and lin.embed_dtype is None:  # the target's table as the graph reads it
            table = writer.store.arrays["embed"]
        else:  # a stand-in: the Gather of it is replaced by the target's own lookup below
            table = np.broadcast_to(np.zeros((), writer.dtype), (writer.arch.vocab_size, writer.arch.hidden_size))
        model = w.build(
            f"{stem}.weights",
            offsets,
            embed=("target.weights", index_t["embed"]["offset"] if "embed" in index_t else 0, table),
        )
        if "embed" not in index_t or lin.embed_dtype is not None:
            _target_lookup(model, writer, index_t)
    onnx.save(model, folder / f"{stem}.onnx")
    weights = es.weight_specs(index, _external(model))
    if target is not None:
        for name in _external(model) - set(index):  # the target's arrays the graph reads in place
            weights[name] = WeightSpec.from_json(index_t[name] | {"file": "target.weights"})
    return DrafterFiles(stem, model, index, weights)


def _target_lookup(model: onnx.ModelProto, writer: LlamaGraphWriter, index_t: dict) -> None:
    """A drafter graph's Gather of the target's embedding table replaced by the target's own lookup
    (linears.Linears.embed_rows: its tied LM head's blocks, or its fp16 / bf16 table cast), reading the
    target's arrays from target.weights in place: the rows are the target's, bitwise."""
    from edgespec.export.target.graph.builder import GraphBuilder, external_initializers

    g = model.graph
    inputs = {i.name: len(i.type.tensor_type.shape.dim) for i in g.input}
    consts = {i.name: i for i in g.initializer}
    kept = [i for i in g.initializer if i.name != "embed"]  # the stand-in table
    del g.initializer[:]
    g.initializer.extend(kept)
    producers = {o: n for n in g.node for o in n.output}
    nodes = []
    for node in g.node:
        if node.op_type != "Gather" or node.input[0] != "embed":
            nodes.append(node)
            continue
        ids = node.input[1]
        rank = inputs.get(ids)
        if rank is None:  # ids reshaped from an input: the rank of the shape constant
            shape = consts.get(producers[ids].input[1]) if ids in producers else None
            rank = int(shape.dims[0]) if shape is not None and len(shape.dims) == 1 else 2
        b = GraphBuilder(writer.store, writer.dtype)
        out = writer.linears.embed_rows(b, ids, rank, "/target_embed")
        b.nodes.append(onnx.helper.make_node("Identity", [out], list(node.output), name=node.name + "/target"))
        nodes += b.nodes
        have = {i.name for i in g.initializer}
        g.initializer.extend(c for c in b.consts if c.name not in have)
        offsets = {n: index_t[n]["offset"] for n in b.used_weights}
        g.initializer.extend(
            i
            for i in external_initializers(b.used_weights, writer.store, "target.weights", offsets)
            if i.name not in have
        )
    del g.node[:]
    g.node.extend(nodes)
    if any(n.domain and n.domain not in {o.domain for o in model.opset_import} for n in nodes):
        for d in sorted({n.domain for n in nodes if n.domain} - {o.domain for o in model.opset_import}):
            model.opset_import.append(onnx.helper.make_opsetid(d, 1))


def token_head_spec(
    role: str,
    w: ModelWriter,
    files: DrafterFiles,
    widths: list[int],
    chunk: int,
    vocab: int,
    head: HeadInfo,
    aux_layers: tuple[int, ...] = (),
    **extra,
) -> ModelSpec:
    """The manifest entry of a one-layer head on the token-graph I/O with a features input (EAGLE,
    EAGLE-3): vocab draft tokens, fed at the target's widths. extra: more ModelSpec fields."""
    return token_spec(
        w,
        role,
        role,
        f"{files.stem}.onnx",
        widths,
        chunk,
        n_layers=1,
        vocab=vocab,
        aux_layers=aux_layers,
        weights_file=f"{files.stem}.weights",
        weights=files.weights,
        features=True,
        d2t=files.spec("d2t"),
        head=head,
        **extra,
    )
