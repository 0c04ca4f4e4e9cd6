"""The target's weights, from one of three sources behind one interface (WeightSource): its
safetensors checkpoint or GGUF read one tensor at a time (StreamedSource: no PyTorch model of it,
memory follows the largest tensor), else the model loaded whole through transformers
(TransformersSource). The export opens, writes, describes and validates the target the same way
whichever it is (exporter.export); `weight_source` picks it."""

from __future__ import annotations

from pathlib import Path

from edgespec.export.target.arch import ArchSpec, arch_from_config
from edgespec.export.target.checks.sampled import validate_sampled
from edgespec.export.target.checks.stored import check_floats
from edgespec.export.target.checks.validate import validate_model
from edgespec.export.target.families import STREAMED
from edgespec.export.target.graph.builder import GraphOptions
from edgespec.export.target.graph.store import write_weights
from edgespec.export.target.graph.streaming import StreamingWriter
from edgespec.export.target.graph.writer import LlamaGraphWriter
from edgespec.export.target.quant.blocks import CheckpointWeights
from edgespec.export.target.sources.configs import generation_config as generation_config_of
from edgespec.export.target.sources.configs import gguf_hf_config, load_tokenizer, target_config
from edgespec.export.target.sources.gguf import open_gguf
from edgespec.export.target.sources.resolve import GGUF_KINDS, Source
from edgespec.export.target.sources.safetensors import CheckpointError, StreamedWeights, open_weights
from edgespec.export.target.sources.transformers import hf_weights, read_blocks


class WeightSource:
    """Where the target's weights come from. open(): what the export reads besides the weights
    written (the tokenizer; through transformers, the model); write(): the weights stored by a graph
    writer into the folder's target.weights; validate(): the target graph against PyTorch."""

    verb = "opened"  # the progress step once open ("opened" / "loaded")
    model = None  # the PyTorch model (None: no model of the target is ever made)

    def __init__(self, src: Source, hf_cfg, why: str = "") -> None:
        self.src = src  # the --target it reads
        self.hf_cfg = hf_cfg  # its transformers config (set by open() where it comes with the model)
        self.why = why  # why its weights are not streamed ("": they are)
        self.tok = None  # its tokenizer (open)
        self.weights = None  # the float32 weights by HF name the graph writers read (write)

    def describe(self) -> str:
        """Which path the export takes, for the progress line."""
        raise NotImplementedError

    def open(self) -> None:
        raise NotImplementedError

    def write(self, arch: ArchSpec, opts: GraphOptions, folder: Path) -> tuple[LlamaGraphWriter, dict[str, dict]]:
        """(the target's writer, the index of folder/target.weights it stored)."""
        raise NotImplementedError

    def generation_config(self):
        """What holds the model's stop ids (its generation config; exporter._eos_ids reads it)."""
        raise NotImplementedError

    def validate(self, man, ctx, tokens, tol: float) -> dict[str, float]:
        """The target graph's |ORT - PyTorch| logits per width."""
        raise NotImplementedError


class StreamedSource(WeightSource):
    """A local safetensors checkpoint or GGUF, read, quantized and written one tensor at a time."""

    def __init__(self, src: Source, hf_cfg, weights: StreamedWeights) -> None:
        super().__init__(src, hf_cfg)
        self.weights = weights

    def describe(self) -> str:
        kind = "GGUF" if self.src.kind in GGUF_KINDS else "safetensors"
        return f"streaming export: {kind} read, quantized and written one tensor at a time"

    def open(self) -> None:
        self.tok = load_tokenizer(self.src)

    def write(self, arch: ArchSpec, opts: GraphOptions, folder: Path) -> tuple[LlamaGraphWriter, dict[str, dict]]:
        writer = StreamingWriter(arch, self.weights, opts, folder / "target.spool")
        index = writer.write_weights(folder / "target.weights")  # every array's bytes CRC-checked
        check_floats(writer, self.weights, folder / "target.weights", index)
        return writer, index

    def generation_config(self):
        return generation_config_of(self.src, self.hf_cfg)

    def validate(self, man, ctx, tokens, tol: float) -> dict[str, float]:
        """On a sampled model of its layers (checks/sampled.py: the whole model is never in memory)."""
        return validate_sampled(man, ctx, self.weights, self.hf_cfg, tokens, tol)


class TransformersSource(WeightSource):
    """The model loaded whole through transformers in float32 (a GGUF's quantized blocks kept
    where the int4 precision holds them exactly)."""

    verb = "loaded"

    def __init__(self, src: Source, hf_cfg, why: str, keep_blocks: bool) -> None:
        super().__init__(src, hf_cfg, why)
        self.keep_blocks = keep_blocks  # --precision int4 --gguf-blocks keep

    def describe(self) -> str:
        return f"export through transformers (the whole model in float32): {self.why}"

    def open(self) -> None:
        from edgespec.export.target import sources  # sources.load: the one tests replace

        self.model, self.tok = sources.load(self.src)
        self.hf_cfg = self.model.config

    def write(self, arch: ArchSpec, opts: GraphOptions, folder: Path) -> tuple[LlamaGraphWriter, dict[str, dict]]:
        w = hf_weights(self.model)
        if self.src.kind in GGUF_KINDS:  # int4: its quantized blocks kept where MatMulNBits holds them exactly
            w = CheckpointWeights(w, read_blocks(self.src.path, self.model, w, decode_blocks=self.keep_blocks))
        self.weights = w
        writer = LlamaGraphWriter(arch, w, opts)
        return writer, write_weights(writer.store.arrays, folder / "target.weights")

    def generation_config(self):
        return self.model

    def validate(self, man, ctx, tokens, tol: float) -> dict[str, float]:
        return validate_model(ctx.folder, "target", ctx.reference_target(), tokens, tol)


def weight_source(cfg, src: Source, shipping: dict) -> WeightSource:
    """The target's weights: streamed where they can be (why_not; a GGUF's config is transformers'
    own), else through transformers, saying why. Nothing heavy is read until open()."""
    hf_cfg = target_config(src) if src.kind == "hf" else None
    keep = cfg.precision == "int4" and cfg.gguf_blocks == "keep"  # both paths keep a GGUF's blocks alike
    why = why_not(cfg, src, shipping, hf_cfg)
    if why is not None:
        return TransformersSource(src, hf_cfg, why, keep)
    try:
        if src.kind in GGUF_KINDS:
            hf_cfg = gguf_hf_config(src)
            weights = open_gguf(src.path, arch_from_config(hf_cfg, cfg.max_len), hf_cfg, keep)
        else:
            weights = open_weights(Path(src.path), arch_from_config(hf_cfg, cfg.max_len))
    except CheckpointError as e:
        return TransformersSource(src, hf_cfg, str(e), keep)
    return StreamedSource(src, hf_cfg, weights)


def why_not(cfg, src, shipping: dict, hf_cfg) -> str | None:
    """Why this export cannot stream its target (then it loads the model through transformers), or
    None when it can: a local safetensors folder of a streamed family or a local GGUF (its
    architecture and tensor types are checked when it opens: sources/gguf.open_gguf), no drafter
    that ships models (they read the target's PyTorch model and its whole weights), not a quantized
    safetensors checkpoint, not --stream-weights off."""
    if getattr(cfg, "stream_weights", "auto") == "off":
        return "--stream-weights off"
    if src.kind == "hub":
        return "a hub id (streamed from local safetensors and GGUF files only)"
    if shipping:
        return f"the drafters {', '.join(shipping)} read the target's PyTorch model"
    if src.kind != "hf":
        return None
    mt = getattr(hf_cfg, "model_type", None)
    if mt not in STREAMED:
        return f"model_type {mt!r} is not streamed yet ({', '.join(STREAMED)} are)"
    if getattr(hf_cfg, "quantization_config", None):
        return "a quantized checkpoint (quantization_config)"
    return None
