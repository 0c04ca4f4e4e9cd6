"""The graph and model specs of a manifest: each model's one graph (its I/O declared once, with
the symbolic axes TOKENS and WINDOW), its weights index and its architecture. Read and written by
engines/manifest.py, generically (engines/serial.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.engines.rope import RopeTable
from edgespec.engines.serial import Serial

TOKENS = "T"  # symbolic axis: tokens per call, one of the graph's widths
WINDOW = "S"  # symbolic axis: cache slots read, a multiple of kv_bucket with S >= past_len + T
KV_KINDS = ("key", "value")  # the two tensors a templated per-layer KV entry expands to, per layer
KV_TEMPLATE = "past_{kind}_{layer}"  # the per-layer cache inputs, in the model's kv_dtype
# a graph that also reads an fp16 cache declares these inputs (float16, [S, Hkv*D]); a call binds the
# cache to one of the two templates and an empty [0, Hkv*D] tensor to the other (engines/context.py)
KV16_TEMPLATE = "past_{kind}_f16_{layer}"


class ManifestError(ValueError):
    """An engine folder whose manifest is missing, of another version, or inconsistent."""


@dataclass(frozen=True)
class TensorSpec(Serial):
    name: str  # graph input/output name; with layers > 0 a template with {kind} and {layer}
    shape: tuple[int | str, ...]  # ints, TOKENS or WINDOW
    dtype: str  # numpy dtype name
    layers: int = 0  # 0: one tensor; N: 2N tensors, per layer 0..N-1 its "key" then its "value"

    def names(self) -> tuple[str, ...]:
        """The graph names this entry stands for, in graph order."""
        if not self.layers:
            return (self.name,)
        return tuple(self.name.format(kind=k, layer=i) for i in range(self.layers) for k in KV_KINDS)

    def shape_at(self, tokens: int, window: int) -> tuple[int, ...]:
        """The concrete shape of a call of `tokens` tokens reading `window` cache slots."""
        return tuple(tokens if d == TOKENS else window if d == WINDOW else d for d in self.shape)


@dataclass(frozen=True)
class GraphSpec(Serial):
    file: str  # ONNX file, relative to the folder (one graph serves every width)
    widths: tuple[int, ...]  # the static T values it is fed at, ascending
    phases: dict[str, tuple[int, ...]]  # "prefill" / "decode" / "verify" -> the widths serving it
    inputs: tuple[TensorSpec, ...]  # in graph order
    outputs: tuple[TensorSpec, ...]  # in graph order
    flavour: str = "portable"  # "portable": standard ONNX ops (TensorRT parses it); "lean": ONNX Runtime
    #                            contrib ops where they keep decode/verify rows bitwise alike (CPU, CUDA EPs)
    portable_ops: tuple[str, ...] = ()  # lean: the fused ops ("norm", "rotary", "silu", "gelu") in portable
    #                                     form because they broke that rule on the exporting CPU

    def phase(self, width: int) -> str:
        for name, widths in self.phases.items():
            if width in widths:
                return name
        raise ManifestError(
            f"{self.file} has no graph of width {width} (has {list(self.widths)}); re-export with a larger --k"
        )

    def input_names(self) -> tuple[str, ...]:
        return tuple(n for t in self.inputs for n in t.names())

    def output_names(self) -> tuple[str, ...]:
        return tuple(n for t in self.outputs for n in t.names())

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)


@dataclass(frozen=True)
class WeightSpec(Serial):
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]  # array shape
    offset: int  # byte offset in the weights file
    nbytes: int  # byte length
    file: str | None = None  # another model's weights file (an EAGLE head reads the target's embedding)
    rope: RopeTable | None = None  # a rotary table computed at load from these parameters (no bytes stored;
    #                                file names rope.COMPUTED_FILE, offset 0)


@dataclass(frozen=True)
class Architecture(Serial):
    model_type: str  # HF model_type of the model the graph computes ("llama", "qwen2", ...)
    n_layers: int  # decoder layers in the graph (a self:N draft has N, an EAGLE head 1)
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads
    head_dim: int  # per-head width
    hidden_size: int  # residual width
    intermediate_size: int  # MLP inner width
    vocab_size: int  # logits width (an EAGLE head: its draft vocabulary)
    aux_layers: tuple[int, ...] = ()  # layers whose input residual stream hidden_aux concatenates (EAGLE-3)
    sliding_window: int | None = None  # the sliding layers' key window (Gemma 3: a query at p sees keys j with
    #                                    p - j < it; a --host-prologue engine builds their masks); None: none


@dataclass(frozen=True)
class WeightOrigin(Serial):
    kind: str  # a kind of linear weight: its parameter name without the layer ("self_attn.q_proj", "lm_head")
    source: str  # its type in the checkpoint: a GGUF type ("Q4_1", "Q6_K", "F16") or "float" (HF weights)
    stored: str  # what the graph multiplies by: "int4 codes + block mins", "int8 codes", "int4 (re-quantized)", "fp32"
    exact: bool  # the graph's weights are the checkpoint's values, bit for bit
    tensors: int  # weights of this kind, source and storage
    why: str = ""  # quantized blocks re-quantized: why they were not kept


@dataclass(frozen=True)
class TrtInfo(Serial):
    file: str  # serialized TensorRT engine, relative to the folder
    tensorrt_version: str  # the TensorRT that built it (engines only load in that version)
    gpu: str  # the GPU it was built for (engines only load there)
    profiles: dict[int, int]  # token width -> optimization profile index


@dataclass(frozen=True)
class HeadInfo(Serial):
    source: str  # the head checkpoint folder it was exported from
    target_vocab_size: int  # the target vocabulary its d2t maps into
    trained_draft_vocab_size: int  # draft tokens it was trained with (the export may keep fewer)
    trained: dict  # the training record of the checkpoint's config.json, as its trainer wrote it
    rope_theta: float | None = None  # the RoPE base its graph rotates with (None: not recorded)
    rope_theta_from: str = ""  # where that base came from: its config.json, its target's, --eagle-rope-theta


class _FromArch:
    """A ModelSpec attribute that is its Architecture's of the same name (not a field of its own)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, spec, owner=None):
        return self if spec is None else getattr(spec.arch, self.name)


@dataclass(frozen=True)
class ModelSpec(Serial):
    role: str  # "target", or the role a drafter section gives it (errors and file checks name it)
    kind: str  # "target", "model" (separate draft), "self:N" (target's first N layers), "self:int4", or a
    #            drafter's own kind of graph
    precision: str  # "fp32" | "fp16" | "int4"
    arch: Architecture  # the numbers of what the graph computes
    kv_dtype: str  # KV buffer dtype
    weights_file: str  # external data file of the graph
    weights: dict[str, WeightSpec]  # initializer index (into weights_file unless a WeightSpec names a file)
    graph: GraphSpec  # the one graph, fed at every width
    validation: dict[str, float] = field(default_factory=dict)  # "<phase>_t<width>" -> max |ORT - PyTorch|
    d2t: WeightSpec | None = None  # EAGLE head: draft-vocabulary id -> target id (int64 [Vd])
    head: HeadInfo | None = None  # EAGLE head: where it came from
    tensorrt: TrtInfo | None = None  # the engine `edgespec build-trt` built from the graph
    weight_origins: tuple[WeightOrigin, ...] = ()  # per kind of linear weight: its checkpoint type and what the
    #                                                graph keeps of it (GGUF blocks kept exactly, or re-quantized);
    #                                                (): not recorded (a folder from before edgespec recorded it)
    rowop_layout: int = 0  # the row kernel's record layout of its packed weights (rowop.LAYOUT_VERSION when
    #                        written; 0: none, or a folder from before it was recorded: layout 1)

    # the architecture's numbers, read through (spec.n_layers is spec.arch.n_layers)
    n_layers = _FromArch()
    n_kv_heads = _FromArch()
    head_dim = _FromArch()
    hidden_size = _FromArch()
    vocab_size = _FromArch()
    aux_layers = _FromArch()

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def takes_tree(self) -> bool:
        """The graph takes a token tree (tree_mask input; exported with --trees)."""
        return "tree_mask" in self.graph.input_names()

    @property
    def takes_features(self) -> bool:
        """The graph takes features [1, T, H] (an EAGLE head: the target's hidden states or its own)."""
        return "features" in self.graph.input_names()

    @property
    def aux_width(self) -> int:
        """Width of the hidden_aux output (aux features: low/mid/high layers), 0 when the graph has none."""
        aux = self.graph.output("hidden_aux")
        return int(aux.shape[-1]) if aux else 0

    @property
    def top_k(self) -> int:
        """Next-token candidates per row the graph outputs (topk_ids, topk_probs: the recycle drafter's
        table reads them), 0 when it has none (portable graphs, folders written before them)."""
        ids = self.graph.output("topk_ids")
        return int(ids.shape[-1]) if ids else 0

    def widths(self) -> list[int]:
        return list(self.graph.widths)


@dataclass(frozen=True)
class HeadsSpec(Serial):
    role: str  # the role its drafter section gives it
    precision: str  # "fp32" | "fp16" | "int4"
    n_heads: int  # K: tokens drafted per call (head i drafts i + 2 places past its feature)
    n_layers: int  # residual blocks per head
    hidden_size: int  # feature width (the target's hidden size)
    vocab_size: int  # draft vocabulary Vd (the logits width; map with d2t)
    file: str  # ONNX graph: features [1, H] -> logits [K, Vd] (one width)
    inputs: tuple[TensorSpec, ...]  # in graph order
    outputs: tuple[TensorSpec, ...]  # in graph order
    weights_file: str  # external data file of the graph
    weights: dict[str, WeightSpec]  # initializer index into weights_file
    d2t: WeightSpec  # draft-vocabulary id -> target id (int64 [Vd])
    head: HeadInfo  # where the heads came from
    validation: dict[str, float] = field(default_factory=dict)  # "heads" -> max |ORT - PyTorch| at export
