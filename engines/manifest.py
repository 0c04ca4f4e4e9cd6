"""manifest.json: the contract between `edgespec export` and the runtime (torch-free).

This module is the only reader and the only writer of manifest.json. Export builds a `Manifest`
and saves it; `edgespec tune` and `edgespec build-trt` load it, `dataclasses.replace` a field and
save it again. Everything the runtime needs is written here; nothing is inferred from file names.

Each model has one ONNX graph fed at several static token widths T; its inputs and outputs are
declared once, with the symbolic axes TOKENS ("T": the call's width) and WINDOW ("S": the cache
slots read), and the per-layer KV inputs as one templated entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "edgespec.engine"
VERSION = 2  # raised whenever a reader of the previous layout would misread the new one
MANIFEST = "manifest.json"
PHASES = ("prefill", "decode", "verify")
FUSED_PREFIX = "eagle/"  # the EAGLE head's inputs/outputs/weights inside the fused target+head graph
TOKENS = "T"  # symbolic axis: tokens per call, one of the graph's widths
WINDOW = "S"  # symbolic axis: cache slots read, a multiple of kv_bucket with S >= past_len + T
KV_KINDS = ("key", "value")  # the two tensors a templated per-layer KV entry expands to, per layer


class ManifestError(ValueError):
    """An engine folder whose manifest is missing, of another version, or inconsistent."""


@dataclass(frozen=True)
class FileRecord:
    size: int  # bytes, as export wrote the file (checked at every load: a stat)
    sha256: str  # hex digest (checked with --verify and by `edgespec check`: reads the whole file)

    def to_json(self) -> dict:
        return {"size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: dict) -> FileRecord:
        return cls(int(d["size"]), str(d["sha256"]))


def sha256_of_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class TensorSpec:
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

    def to_json(self) -> dict:
        d = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        return d | {"layers": self.layers} if self.layers else d

    @classmethod
    def from_json(cls, d: dict) -> TensorSpec:
        return cls(d["name"], tuple(d["shape"]), d["dtype"], d.get("layers", 0))


@dataclass(frozen=True)
class GraphSpec:
    file: str  # ONNX file, relative to the folder (one graph serves every width)
    widths: tuple[int, ...]  # the static T values it is fed at, ascending
    phases: dict[str, tuple[int, ...]]  # "prefill" / "decode" / "verify" -> the widths serving it
    inputs: tuple[TensorSpec, ...]  # in graph order
    outputs: tuple[TensorSpec, ...]  # in graph order
    flavour: str = "portable"  # "portable": standard ONNX ops (TensorRT parses it); "lean": ONNX Runtime
    #                            contrib ops where they keep decode/verify rows bitwise alike (CPU, CUDA EPs)
    portable_ops: tuple[str, ...] = ()  # lean: the fused ops ("norm", "rotary", "silu") written in portable
    #                                     form because they broke that rule on the exporting CPU

    def phase(self, width: int) -> str:
        for name, widths in self.phases.items():
            if width in widths:
                return name
        raise ManifestError(f"{self.file} has no graph of width {width} (has {list(self.widths)}); "
                            "re-export with a larger --k")

    def input_names(self) -> tuple[str, ...]:
        return tuple(n for t in self.inputs for n in t.names())

    def output_names(self) -> tuple[str, ...]:
        return tuple(n for t in self.outputs for n in t.names())

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    def to_json(self) -> dict:
        return {"file": self.file, "widths": list(self.widths),
                "phases": {k: list(v) for k, v in self.phases.items()},
                "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs],
                "flavour": self.flavour, "portable_ops": list(self.portable_ops)}

    @classmethod
    def from_json(cls, d: dict) -> GraphSpec:
        return cls(d["file"], tuple(d["widths"]), {k: tuple(v) for k, v in d["phases"].items()},
                   tuple(map(TensorSpec.from_json, d["inputs"])), tuple(map(TensorSpec.from_json, d["outputs"])),
                   d.get("flavour", "portable"), tuple(d.get("portable_ops", ())))


@dataclass(frozen=True)
class WeightSpec:
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]  # array shape
    offset: int  # byte offset in the weights file
    nbytes: int  # byte length
    file: str | None = None  # another model's weights file (an EAGLE head reads the target's embedding)

    def to_json(self) -> dict:
        d = {"dtype": self.dtype, "shape": list(self.shape), "offset": self.offset, "nbytes": self.nbytes}
        return d | {"file": self.file} if self.file else d

    @classmethod
    def from_json(cls, d: dict) -> WeightSpec:
        return cls(d["dtype"], tuple(d["shape"]), d["offset"], d["nbytes"], d.get("file"))


def _weights_json(file: str, weights: dict[str, WeightSpec]) -> dict:
    return {"file": file, "tensors": {k: w.to_json() for k, w in weights.items()}}


def _weights_from(d: dict) -> dict[str, WeightSpec]:
    return {k: WeightSpec.from_json(v) for k, v in d["tensors"].items()}


@dataclass(frozen=True)
class Architecture:
    model_type: str  # HF model_type of the model the graph computes ("llama", "qwen2", ...)
    n_layers: int  # decoder layers in the graph (a self:N draft has N, an EAGLE head 1)
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads
    head_dim: int  # per-head width
    hidden_size: int  # residual width
    intermediate_size: int  # MLP inner width
    vocab_size: int  # logits width (an EAGLE head: its draft vocabulary)
    aux_layers: tuple[int, ...] = ()  # layers whose input residual stream hidden_aux concatenates (EAGLE-3)

    def to_json(self) -> dict:
        d = {"model_type": self.model_type, "n_layers": self.n_layers, "n_heads": self.n_heads,
             "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim, "hidden_size": self.hidden_size,
             "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size}
        return d | {"aux_layers": list(self.aux_layers)} if self.aux_layers else d

    @classmethod
    def from_json(cls, d: dict) -> Architecture:
        return cls(d["model_type"], d["n_layers"], d["n_heads"], d["n_kv_heads"], d["head_dim"], d["hidden_size"],
                   d["intermediate_size"], d["vocab_size"], tuple(d.get("aux_layers", ())))


@dataclass(frozen=True)
class TrtInfo:
    file: str  # serialized TensorRT engine, relative to the folder
    tensorrt_version: str  # the TensorRT that built it (engines only load in that version)
    gpu: str  # the GPU it was built for (engines only load there)
    profiles: dict[int, int]  # token width -> optimization profile index

    def to_json(self) -> dict:
        return {"file": self.file, "tensorrt_version": self.tensorrt_version, "gpu": self.gpu,
                "profiles": {str(w): i for w, i in self.profiles.items()}}

    @classmethod
    def from_json(cls, d: dict) -> TrtInfo:
        return cls(d["file"], d["tensorrt_version"], d["gpu"], {int(w): int(i) for w, i in d["profiles"].items()})


@dataclass(frozen=True)
class HeadInfo:
    source: str  # the head checkpoint folder it was exported from
    target_vocab_size: int  # the target vocabulary its d2t maps into
    trained_draft_vocab_size: int  # draft tokens it was trained with (the export may keep fewer)
    trained: dict  # the training record of the checkpoint's config.json, as its trainer wrote it

    def to_json(self) -> dict:
        return {"source": self.source, "target_vocab_size": self.target_vocab_size,
                "trained_draft_vocab_size": self.trained_draft_vocab_size, "trained": self.trained}

    @classmethod
    def from_json(cls, d: dict) -> HeadInfo:
        return cls(d["source"], d["target_vocab_size"], d["trained_draft_vocab_size"], d["trained"])


@dataclass(frozen=True)
class DFlashInfo:
    block_size: int  # b: rows per drafting call (the anchor + b-1 drafts)
    mask_token_id: int  # the token whose embedding fills the rows to draft
    feature_width: int  # n*H: the target's hidden_aux width it reads (ctx_aux's last axis)
    max_position: int  # rows of the drafter's rope table (positions past it reuse the last row)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> DFlashInfo:
        return cls(int(d["block_size"]), int(d["mask_token_id"]), int(d["feature_width"]), int(d["max_position"]))


@dataclass(frozen=True)
class ModelSpec:
    role: str  # "target", "draft", "eagle", "eagle_fused" or "eagle3" (its key in the manifest)
    kind: str  # "target", "model" (separate draft), "self:N" (target's first N layers), "self:int4",
    #            "eagle", "target+eagle", "eagle3"
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
    fc: WeightSpec | None = None  # EAGLE-3 head: fc transposed [n*H, H] float32, which the runtime applies
    #                               to the target's hidden_aux rows to make the head's features input
    dflash: DFlashInfo | None = None  # DFlash drafter: its block settings (its graph's widths are context rows C)

    @property
    def n_layers(self) -> int:
        return self.arch.n_layers

    @property
    def n_kv_heads(self) -> int:
        return self.arch.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.arch.head_dim

    @property
    def hidden_size(self) -> int:
        return self.arch.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.arch.aux_layers

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
        """Width of the hidden_aux output (EAGLE-3 features), 0 when the graph has none."""
        aux = self.graph.output("hidden_aux")
        return int(aux.shape[-1]) if aux else 0

    def widths(self) -> list[int]:
        return list(self.graph.widths)

    def to_json(self) -> dict:
        d = {"kind": self.kind, "precision": self.precision, "architecture": self.arch.to_json(),
             "kv_dtype": self.kv_dtype, "weights": _weights_json(self.weights_file, self.weights),
             "graph": self.graph.to_json(), "validation": dict(self.validation)}
        optional = {"d2t": self.d2t, "head": self.head, "tensorrt": self.tensorrt, "fc": self.fc,
                    "dflash": self.dflash}
        return d | {k: v.to_json() for k, v in optional.items() if v is not None}

    @classmethod
    def from_json(cls, d: dict, role: str) -> ModelSpec:
        return cls(role=role, kind=d["kind"], precision=d["precision"], arch=Architecture.from_json(d["architecture"]),
                   kv_dtype=d["kv_dtype"], weights_file=d["weights"]["file"], weights=_weights_from(d["weights"]),
                   graph=GraphSpec.from_json(d["graph"]), validation=dict(d["validation"]),
                   d2t=WeightSpec.from_json(d["d2t"]) if "d2t" in d else None,
                   head=HeadInfo.from_json(d["head"]) if "head" in d else None,
                   tensorrt=TrtInfo.from_json(d["tensorrt"]) if "tensorrt" in d else None,
                   fc=WeightSpec.from_json(d["fc"]) if "fc" in d else None,
                   dflash=DFlashInfo.from_json(d["dflash"]) if "dflash" in d else None)


@dataclass(frozen=True)
class HeadsSpec:
    role: str  # "medusa"
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

    def to_json(self) -> dict:
        return {"kind": "medusa", "precision": self.precision,
                "architecture": {"n_heads": self.n_heads, "n_layers": self.n_layers, "hidden_size": self.hidden_size,
                                 "vocab_size": self.vocab_size},
                "graph": {"file": self.file, "inputs": [t.to_json() for t in self.inputs],
                          "outputs": [t.to_json() for t in self.outputs]},
                "weights": _weights_json(self.weights_file, self.weights), "d2t": self.d2t.to_json(),
                "head": self.head.to_json(), "validation": dict(self.validation)}

    @classmethod
    def from_json(cls, d: dict, role: str) -> HeadsSpec:
        a, g = d["architecture"], d["graph"]
        return cls(role=role, precision=d["precision"], n_heads=a["n_heads"], n_layers=a["n_layers"],
                   hidden_size=a["hidden_size"], vocab_size=a["vocab_size"], file=g["file"],
                   inputs=tuple(map(TensorSpec.from_json, g["inputs"])),
                   outputs=tuple(map(TensorSpec.from_json, g["outputs"])), weights_file=d["weights"]["file"],
                   weights=_weights_from(d["weights"]), d2t=WeightSpec.from_json(d["d2t"]),
                   head=HeadInfo.from_json(d["head"]), validation=dict(d["validation"]))


@dataclass(frozen=True)
class Source:
    kind: str  # "default" | "hf" | "gguf" | "hub"
    path: str  # folder, .gguf file or hub id the target was read from
    sha256: str | None  # of the GGUF file or the HF folder's weights (None for a hub id)
    draft: str | None  # the --draft the folder was exported with

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "sha256": self.sha256, "draft": self.draft}

    @classmethod
    def from_json(cls, d: dict) -> Source:
        return cls(d["kind"], d["path"], d["sha256"], d["draft"])


@dataclass(frozen=True)
class Tuned:
    date: str  # ISO date of the `edgespec tune` run
    prompts: str | None  # the prompts file it ran on (None: HumanEval)
    n_prompts: int  # prompts it ran on
    prefill_share: float  # prefill's share of plain decoding time
    speedup_vs_none: float  # the chosen setting's tok/s over plain decoding's
    tokens_per_s: float  # the chosen setting's tok/s
    machine: str  # the CPU it ran on
    table: str  # the comparison table the choice was made from

    def to_json(self) -> dict:
        return {"date": self.date, "prompts": self.prompts, "n_prompts": self.n_prompts,
                "prefill_share": self.prefill_share, "speedup_vs_none": self.speedup_vs_none,
                "tokens_per_s": self.tokens_per_s, "machine": self.machine, "table": self.table}

    @classmethod
    def from_json(cls, d: dict) -> Tuned:
        return cls(d["date"], d["prompts"], d["n_prompts"], d["prefill_share"], d["speedup_vs_none"],
                   d["tokens_per_s"], d["machine"], d["table"])


@dataclass(frozen=True)
class Defaults:
    k: int  # num_speculative_tokens when the user gives none
    adaptive: bool  # adapt k to the acceptance rate when the user does not say
    drafter: str = "ngram"  # drafter when the user gives none
    eagle_min_confidence: float | None = None  # EAGLE chain cut-off; None: the runtime's own default
    medusa_min_confidence: float | None = None  # Medusa chain cut-off; None: the runtime's own default
    tuned: Tuned | None = None  # how `edgespec tune` chose these; None: export's defaults

    def to_json(self) -> dict:
        d = {"drafter": self.drafter, "k": self.k, "adaptive": self.adaptive}
        optional = {"eagle_min_confidence": self.eagle_min_confidence,
                    "medusa_min_confidence": self.medusa_min_confidence}
        d |= {k: v for k, v in optional.items() if v is not None}
        return d | {"tuned": self.tuned.to_json()} if self.tuned else d

    @classmethod
    def from_json(cls, d: dict) -> Defaults:
        return cls(k=d["k"], adaptive=d["adaptive"], drafter=d["drafter"],
                   eagle_min_confidence=d.get("eagle_min_confidence"),
                   medusa_min_confidence=d.get("medusa_min_confidence"),
                   tuned=Tuned.from_json(d["tuned"]) if "tuned" in d else None)


@dataclass(frozen=True)
class Manifest:
    folder: Path  # where manifest.json lives (not written: the folder may move)
    name: str  # engine name
    edgespec_version: str  # the edgespec that exported the folder
    created: str  # ISO time of the export
    source: Source  # where the target came from
    max_len: int  # context slots in the KV buffers
    kv_bucket: int  # the WINDOW axis is fed in multiples of this
    prefill_chunk: int  # prompt tokens per prefill call
    num_speculative_tokens: int  # largest k the verify widths support
    two_row_matmuls: bool  # int4: 1-token calls run the matmuls on 2 rows (decode rows = verify rows bitwise)
    tokenizer_file: str  # tokenizer.json (HF tokenizers format)
    chat_template_file: str | None  # jinja2 chat template, or None
    eos_token_ids: tuple[int, ...]  # generation stops on any of these
    bos_token_id: int | None  # beginning-of-sequence id
    target: ModelSpec  # the model whose output is reproduced
    draft: ModelSpec | None  # separate draft model, when exported
    eagle: ModelSpec | None  # EAGLE head, when exported
    eagle_fused: ModelSpec | None  # the target graph with the EAGLE head appended (FUSED_PREFIX names)
    medusa: HeadsSpec | None  # Medusa heads, when exported
    drafters: tuple[str, ...]  # drafters the folder supports
    defaults: Defaults  # drafter / k chosen at export or by `edgespec tune`
    files: dict[str, FileRecord] = field(default_factory=dict)  # file -> size and sha256 as exported ({}: an
    #                                                              export older than the records)
    problems: dict[str, str] = field(default_factory=dict, compare=False)  # role -> why its files cannot be
    #                                      used (an optional model; set by load_manifest, never written)
    eagle3: ModelSpec | None = None  # EAGLE-3 head (drafts from the target's hidden_aux), when exported
    dflash: ModelSpec | None = None  # DFlash block drafter (drafts from the target's hidden_aux), when exported

    def path(self, rel: str) -> Path:
        return self.folder / rel

    def role_files(self) -> dict[str, tuple[str, ...]]:
        """role -> the files that model reads (graph, weights, d2t), plus "tokenizer"."""
        out = {}
        for role, s in self.models().items():
            if isinstance(s, HeadsSpec):
                files = [s.file, s.weights_file, s.d2t.file or s.weights_file]
            else:
                files = [s.graph.file, s.weights_file] + [w.file for w in s.weights.values() if w.file]
                files += [s.d2t.file or s.weights_file] if s.d2t is not None else []
            out[role] = tuple(dict.fromkeys(files))
        return out | {"tokenizer": (self.tokenizer_file,)}

    def record_files(self) -> Manifest:
        """This manifest with the size and sha256 of every file its models and tokenizer read (export
        calls it last; the chat template is left out: users edit it)."""
        rels = sorted({f for files in self.role_files().values() for f in files})
        return dataclasses.replace(self, files={rel: FileRecord(self.path(rel).stat().st_size,
                                                                sha256_of_file(self.path(rel))) for rel in rels})

    def check_files(self, verify: bool = False) -> dict[str, str]:
        """file -> "ok", "missing", "not recorded" (an older export), or what is wrong: a size
        mismatch (a stat), or with verify a hash mismatch (reads every file)."""
        out = {}
        for rel in sorted({f for files in self.role_files().values() for f in files}):
            path, rec = self.path(rel), self.files.get(rel)
            if not path.is_file():
                out[rel] = "missing"
            elif rec is None:
                out[rel] = "not recorded"
            elif (size := path.stat().st_size) != rec.size:
                out[rel] = f"size mismatch: {size} bytes, the manifest records {rec.size}"
            elif verify and (digest := sha256_of_file(path)) != rec.sha256:
                out[rel] = f"hash mismatch: sha256 {digest[:16]}..., the manifest records {rec.sha256[:16]}..."
            else:
                out[rel] = "ok"
        return out

    @property
    def chat_template(self) -> str | None:
        """The chat template's text, or None."""
        return self.path(self.chat_template_file).read_text() if self.chat_template_file else None

    def models(self) -> dict[str, ModelSpec | HeadsSpec]:
        """role -> spec of every model the folder holds, target first."""
        specs = {"target": self.target, "draft": self.draft, "eagle": self.eagle, "eagle_fused": self.eagle_fused,
                 "medusa": self.medusa, "eagle3": self.eagle3, "dflash": self.dflash}
        return {role: s for role, s in specs.items() if s is not None}

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "edgespec_version": self.edgespec_version, "name": self.name,
                "created": self.created, "source": self.source.to_json(), "max_len": self.max_len,
                "kv_bucket": self.kv_bucket, "prefill_chunk": self.prefill_chunk,
                "num_speculative_tokens": self.num_speculative_tokens, "two_row_matmuls": self.two_row_matmuls,
                "tokenizer": {"file": self.tokenizer_file, "chat_template_file": self.chat_template_file,
                              "eos_token_ids": list(self.eos_token_ids), "bos_token_id": self.bos_token_id},
                "models": {role: s.to_json() for role, s in self.models().items()},
                "drafters": list(self.drafters), "defaults": self.defaults.to_json()} | (
                    {"files": {rel: r.to_json() for rel, r in self.files.items()}} if self.files else {})

    @classmethod
    def from_json(cls, d: dict, folder: str | Path) -> Manifest:
        models, tok = d["models"], d["tokenizer"]

        def model(role: str) -> ModelSpec | None:
            return ModelSpec.from_json(models[role], role) if role in models else None

        return cls(folder=Path(folder), name=d["name"], edgespec_version=d["edgespec_version"], created=d["created"],
                   source=Source.from_json(d["source"]), max_len=d["max_len"], kv_bucket=d["kv_bucket"],
                   prefill_chunk=d["prefill_chunk"], num_speculative_tokens=d["num_speculative_tokens"],
                   two_row_matmuls=d["two_row_matmuls"], tokenizer_file=tok["file"],
                   chat_template_file=tok["chat_template_file"], eos_token_ids=tuple(tok["eos_token_ids"]),
                   bos_token_id=tok["bos_token_id"], target=model("target"), draft=model("draft"),
                   eagle=model("eagle"), eagle_fused=model("eagle_fused"), eagle3=model("eagle3"),
                   dflash=model("dflash"),
                   medusa=HeadsSpec.from_json(models["medusa"], "medusa") if "medusa" in models else None,
                   drafters=tuple(d["drafters"]), defaults=Defaults.from_json(d["defaults"]),
                   files={rel: FileRecord.from_json(r) for rel, r in d.get("files", {}).items()})

    def save(self) -> Path:
        """Write manifest.json into the folder (atomically: a crash leaves the old one, never half of one)."""
        path = self.folder / MANIFEST
        tmp = path.with_name(MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)
        return path


def is_engine_folder(folder: str | Path) -> bool:
    """Does the folder hold an edgespec manifest (of any version)? Export's --force replaces only these."""
    try:
        d = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("format") == FORMAT


def load_manifest(folder: str | Path, verify: bool = False, files: bool = True) -> Manifest:
    """Read and check an engine folder's manifest; every failure says what to do. File sizes are
    checked against the records (and with verify their sha256): a bad file of the target or the
    tokenizer is an error; one of an optional model (draft, heads) lands in `problems`, and the
    runtime then loads the folder without that model. files=False skips the file checks (`edgespec
    check` reports them itself)."""
    folder = Path(folder)
    mf = folder / MANIFEST
    if not folder.is_dir():
        raise ManifestError(f"engine folder {folder} does not exist. Hint: run `edgespec export --out {folder}`")
    if not mf.exists():
        raise ManifestError(f"{folder} has no {MANIFEST}: not an edgespec engine folder (or an export that "
                            "did not finish). Hint: re-run `edgespec export`.")
    try:
        d = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{mf} is not valid JSON ({e}); re-run `edgespec export`") from e
    fmt = d.get("format") if isinstance(d, dict) else None
    if fmt != FORMAT:
        raise ManifestError(f"{mf}: format {fmt!r}, expected {FORMAT!r}: not an edgespec engine folder")
    version = d.get("version", 1)
    if version != VERSION:
        age = "an older" if isinstance(version, int) and version < VERSION else "a newer"
        raise ManifestError(f"{folder} was exported by {age} edgespec (manifest version {version}; this edgespec "
                            f"reads {VERSION}). Hint: re-export: edgespec export --out {folder} --force")
    try:
        m = Manifest.from_json(d, folder)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ManifestError(f"{mf} lacks or mistypes field {e}; re-run `edgespec export`") from e
    _check(m)
    return _check_files(m, verify) if files else m


def _check_files(m: Manifest, verify: bool) -> Manifest:
    """Raise for a bad file the target or the tokenizer reads; record the others' in `problems`."""
    status = m.check_files(verify)
    problems = {}
    for role, files in m.role_files().items():
        bad = [(rel, status[rel]) for rel in files if status[rel] not in ("ok", "not recorded")]
        if not bad:
            continue
        rel, what = bad[0]
        what = "listed in the manifest is missing" if what == "missing" else what
        if role in ("target", "tokenizer"):
            raise ManifestError(f"{m.folder}: {role} file {rel} {what}. Hint: re-export the folder "
                                f"(edgespec export --out {m.folder} --force)")
        problems[role] = f"{role} file {rel} {what}"
    return dataclasses.replace(m, problems=problems) if problems else m


def _check(m: Manifest) -> None:
    """The models fit together and the chat template exists (the models' files: _check_files)."""
    folder, target = m.folder, m.target
    for spec in filter(None, (m.target, m.draft, m.eagle, m.eagle_fused, m.eagle3)):
        if 1 not in spec.widths():
            raise ManifestError(f"{folder}: {spec.role} model has no decode graph (width 1)")
    fused = m.eagle_fused
    if fused is not None and (m.eagle is None or fused.widths() != target.widths()
                              or fused.vocab_size != target.vocab_size):
        raise ManifestError(f"{folder}: the fused target+EAGLE graph has widths {fused.widths()}, the target "
                            f"{target.widths()}; re-export")
    if m.draft is not None and m.draft.vocab_size != target.vocab_size:
        raise ManifestError(f"draft vocab {m.draft.vocab_size} != target vocab {target.vocab_size}")
    eagle = m.eagle
    if eagle is not None:
        if eagle.d2t is None or eagle.d2t.shape != (eagle.vocab_size,):
            raise ManifestError(f"{folder}: EAGLE head without a d2t map of {eagle.vocab_size} entries; re-export")
        if eagle.hidden_size != target.hidden_size:
            raise ManifestError(f"{folder}: EAGLE head hidden size {eagle.hidden_size} != target's "
                                f"{target.hidden_size}; re-export with a head trained for this target")
    eagle3 = m.eagle3
    if eagle3 is not None:
        if eagle3.d2t is None or eagle3.d2t.shape != (eagle3.vocab_size,) or eagle3.fc is None:
            raise ManifestError(f"{folder}: EAGLE-3 head without its d2t map of {eagle3.vocab_size} entries or its "
                                "fc; re-export")
        if (eagle3.hidden_size != target.hidden_size or eagle3.aux_layers != target.aux_layers
                or eagle3.fc.shape != (target.aux_width, target.hidden_size)):
            raise ManifestError(f"{folder}: EAGLE-3 head (hidden size {eagle3.hidden_size}, layers "
                                f"{eagle3.aux_layers}, fc {eagle3.fc.shape}) does not fit the target (hidden size "
                                f"{target.hidden_size}, hidden_aux of layers {target.aux_layers}); re-export with "
                                "--eagle3-head")
    dflash = m.dflash
    if dflash is not None:
        if dflash.d2t is None or dflash.d2t.shape != (dflash.vocab_size,) or dflash.dflash is None:
            raise ManifestError(f"{folder}: DFlash drafter without its d2t map of {dflash.vocab_size} entries or its "
                                "block settings; re-export")
        if dflash.hidden_size != target.hidden_size or dflash.dflash.feature_width != target.aux_width:
            raise ManifestError(f"{folder}: DFlash drafter (hidden size {dflash.hidden_size}, features "
                                f"{dflash.dflash.feature_width} wide) does not fit the target (hidden size "
                                f"{target.hidden_size}, hidden_aux {target.aux_width} wide); re-export with --dflash")
    medusa = m.medusa
    if medusa is not None:
        if medusa.d2t.shape != (medusa.vocab_size,):
            raise ManifestError(f"{folder}: Medusa heads without a d2t map of {medusa.vocab_size} entries; re-export")
        if medusa.hidden_size != target.hidden_size:
            raise ManifestError(f"{folder}: Medusa heads of hidden size {medusa.hidden_size} != target's "
                                f"{target.hidden_size}; re-export with heads trained for this target")
    for rel in filter(None, (m.chat_template_file,)):  # the tokenizer's: _check_files
        if not (folder / rel).exists():
            raise ManifestError(f"{folder}: tokenizer file {rel} is missing")
