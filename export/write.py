"""Writing one model into the engine folder: its weights file and ONNX graph, returned as its
manifest entry (target and draft decoders, the EAGLE head, the fused target+EAGLE graph, Medusa)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from edgespec.engines.manifest import Architecture, HeadInfo, HeadsSpec, ModelSpec, TensorSpec, WeightSpec
from edgespec.export import spec as es
from edgespec.export.arch import ArchSpec
from edgespec.export.graph import GraphOptions, LlamaGraphWriter
from edgespec.export.weights import write_weights

SHIPPED_HEADS = Path(__file__).parent / "heads"  # trained EAGLE / Medusa heads shipped for default models


def _external(model: onnx.ModelProto) -> set[str]:
    """Names of the initializers the graph reads from its weights file."""
    return {i.name for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}


def write_model(writer: LlamaGraphWriter, folder: Path, role: str, kind: str, widths: list[int], chunk: int,
                weights_file: str, index: dict) -> ModelSpec:
    """<role>.onnx, one graph fed at every width, reading `weights_file` (written by the caller:
    a self:N draft shares the target's)."""
    model = writer.build(weights_file, {name: e["offset"] for name, e in index.items()})
    fname = f"{role}.onnx"
    onnx.save(model, folder / fname)
    a, kv_dtype = writer.arch, writer.dtype.name
    aux = writer.opts.aux_layers
    graph = es.token_graph(fname, widths, chunk, n_layers=writer.n_layers, kv_width=a.n_kv_heads * a.head_dim,
                           hidden_size=a.hidden_size, vocab_size=a.vocab_size, kv_dtype=kv_dtype,
                           trees=writer.opts.trees, aux_width=len(aux) * a.hidden_size, opts=writer.opts)
    arch = Architecture(**(a.to_manifest() | {"n_layers": writer.n_layers}), aux_layers=tuple(aux))
    return ModelSpec(role=role, kind=kind, precision=writer.opts.precision, arch=arch, kv_dtype=kv_dtype,
                     weights_file=weights_file, weights=es.weight_specs(index, _external(model)), graph=graph)


def heads_dir(arg: str | None, src, suffix: str, kind: str) -> Path | None:
    """The drafting-head folder an --eagle / --medusa argument names: none, the shipped one for the
    default model (heads/<name><suffix>), or a folder."""
    if arg in (None, "none", ""):
        return None
    if arg == "auto":
        shipped = SHIPPED_HEADS / (src.name + suffix)
        return shipped if src.kind == "default" and (shipped / "config.json").exists() else None
    path = Path(arg)
    if not path.is_dir():
        raise es.ExportError(f"--{kind} {arg}: not a folder. Hint: train one with `edgespec train-{kind} "
                             f"--out {arg}` or pass --{kind} none")
    return path


def _trained(heads: Path, key: str) -> dict:
    """The training record a head checkpoint's config.json keeps under `key`."""
    return json.loads((heads / "config.json").read_text()).get(key, {})


def write_eagle(head_dir: Path, folder: Path, arch: ArchSpec, writer: LlamaGraphWriter, index_t: dict,
                opts: GraphOptions, widths: list[int], chunk: int, draft_vocab: int | None):
    """eagle.weights + eagle.onnx (the head reads the target's embedding in place); (graph writer,
    manifest entry)."""
    from edgespec.export.checkpoint import HeadFormatError, prune_draft_vocab, read_head
    from edgespec.export.eagle_graph import EagleGraphWriter

    try:
        hc, arrays = read_head(head_dir, arch.hidden_size, arch.vocab_size)
        trained_vocab = hc.draft_vocab_size
        if draft_vocab is None:
            draft_vocab = es.EAGLE_DRAFT_VOCAB if hc.d2t_by_frequency else 0
        hc, arrays = prune_draft_vocab(hc, arrays, draft_vocab)
    except HeadFormatError as e:
        raise es.ExportError(str(e)) from e
    ew = EagleGraphWriter(arch, hc, arrays, writer.reference["lm_head.weight"], opts)
    index_e = write_weights(ew.store.arrays | {"d2t": ew.d2t}, folder / "eagle.weights")
    model = ew.build("eagle.weights", {k: v["offset"] for k, v in index_e.items()},
                     embed=("target.weights", index_t["embed"]["offset"], writer.store.arrays["embed"]))
    onnx.save(model, folder / "eagle.onnx")
    kv_dtype = ew.dtype.name
    weights = es.weight_specs(index_e, _external(model))
    weights["embed"] = WeightSpec.from_json(index_t["embed"] | {"file": "target.weights"})
    graph = es.token_graph("eagle.onnx", widths, chunk, n_layers=1, kv_width=ew.arch.n_kv_heads * ew.arch.head_dim,
                           hidden_size=arch.hidden_size, vocab_size=hc.draft_vocab_size, kv_dtype=kv_dtype,
                           trees=opts.trees, features=True, opts=ew.opts)
    head = HeadInfo(source=str(head_dir), target_vocab_size=arch.vocab_size, trained_draft_vocab_size=trained_vocab,
                    trained=_trained(head_dir, "eagle"))
    spec = ModelSpec(role="eagle", kind="eagle", precision=ew.opts.precision,
                     arch=Architecture(**(ew.arch.to_manifest() | {"n_layers": 1, "vocab_size": hc.draft_vocab_size})),
                     kv_dtype=kv_dtype, weights_file="eagle.weights", weights=weights, graph=graph,
                     d2t=WeightSpec.from_json(index_e["d2t"] | {"file": "eagle.weights"}), head=head)
    return ew, spec


def write_eagle_fused(folder: Path, target: ModelSpec, eagle: ModelSpec) -> ModelSpec:
    """target_eagle.onnx: the target graph with the head appended, on the same weights files."""
    from edgespec.export.eagle_graph import fuse_with_target

    fused = fuse_with_target(onnx.load(folder / target.graph.file, load_external_data=False),
                             onnx.load(folder / eagle.graph.file, load_external_data=False))
    onnx.save(fused, folder / "target_eagle.onnx")
    return es.fused_spec("target_eagle.onnx", target, eagle)


def write_medusa(heads: Path, folder: Path, arch: ArchSpec, writer: LlamaGraphWriter, opts: GraphOptions):
    """medusa.weights + medusa.onnx; (graph writer, manifest entry)."""
    from edgespec.export.checkpoint import MedusaFormatError, read_heads
    from edgespec.export.medusa_graph import MedusaGraphWriter

    try:
        mc, arrays = read_heads(heads, arch.hidden_size, arch.vocab_size)
    except MedusaFormatError as e:
        raise es.ExportError(str(e)) from e
    mw = MedusaGraphWriter(arch, mc, arrays, writer.reference["lm_head.weight"], opts)
    index = write_weights(mw.store.arrays | {"d2t": mw.d2t}, folder / "medusa.weights")
    model = mw.build("medusa.weights", {k: v["offset"] for k, v in index.items()})
    onnx.save(model, folder / "medusa.onnx")
    head = HeadInfo(source=str(heads), target_vocab_size=arch.vocab_size,
                    trained_draft_vocab_size=mc.draft_vocab_size, trained=_trained(heads, "medusa"))
    spec = HeadsSpec(role="medusa", precision=mw.opts.precision, n_heads=mc.n_heads, n_layers=mc.n_layers,
                     hidden_size=mc.hidden_size, vocab_size=mc.draft_vocab_size, file="medusa.onnx",
                     inputs=(TensorSpec("features", (1, mc.hidden_size), mw.dtype.name),),
                     outputs=(TensorSpec("logits", (mc.n_heads, mc.draft_vocab_size), "float32"),),
                     weights_file="medusa.weights", weights=es.weight_specs(index, _external(model)),
                     d2t=WeightSpec.from_json(index["d2t"] | {"file": "medusa.weights"}), head=head)
    return mw, spec
