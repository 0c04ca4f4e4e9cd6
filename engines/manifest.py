"""manifest.json: the contract between `edgespec export` and the runtime (torch-free reader).

Everything the runtime needs is written here; nothing is inferred from file names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "edgespec.engine"
VERSION = 1
MANIFEST = "manifest.json"
PHASES = ("prefill", "decode", "verify")
FUSED_PREFIX = "eagle/"  # the EAGLE head's inputs/outputs/weights inside the fused target+head graph


class ManifestError(ValueError):
    """An engine folder whose manifest is missing, of another version, or inconsistent."""


@dataclass(frozen=True)
class TensorSpec:
    name: str  # graph input/output name
    shape: tuple  # ints, or "S" for the context bucket axis (a multiple of kv_bucket)
    dtype: str  # numpy dtype name


@dataclass(frozen=True)
class GraphSpec:
    phase: str  # "prefill" (T = prefill_chunk), "decode" (T = 1), "verify" (T = k + 1)
    width: int  # T: tokens per call, fixed in the graph
    file: str  # ONNX file, relative to the folder
    inputs: tuple[TensorSpec, ...]  # in graph order
    outputs: tuple[TensorSpec, ...]  # logits [1,T,V], new_kv [L,2,T,Hkv*D], hidden [1,T,H]


@dataclass(frozen=True)
class WeightSpec:
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]  # array shape
    offset: int  # byte offset in the weights file
    nbytes: int  # byte length
    file: str | None = None  # another model's weights file (an EAGLE head reads the target's embedding)


@dataclass(frozen=True)
class ModelSpec:
    role: str  # "target" or "draft"
    kind: str  # "target", "model" (separate draft), "self:N" (target's first N layers), "self:int4"
    precision: str  # "fp32" | "fp16" | "int4"
    n_layers: int  # layers in the graphs (a self:N draft has N)
    n_kv_heads: int  # key/value heads
    head_dim: int  # per-head width
    hidden_size: int  # residual width
    vocab_size: int  # logits width
    kv_dtype: str  # KV buffer dtype
    weights_file: str  # external data file shared by all graphs of this model
    weights: dict[str, WeightSpec]  # initializer index into weights_file
    graphs: tuple[GraphSpec, ...]  # one per phase width
    validation: dict = field(default_factory=dict)  # graph file -> max |ORT - PyTorch| at export
    d2t: WeightSpec | None = None  # EAGLE head: draft-vocabulary id -> target id (int64 [Vd])

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def takes_tree(self) -> bool:
        """The graphs take a token tree (tree_mask input; folders exported before trees lack it)."""
        return any(t.name == "tree_mask" for t in self.graphs[0].inputs)

    def widths(self) -> list[int]:
        return sorted(g.width for g in self.graphs)

    def graph_for(self, width: int) -> GraphSpec:
        for g in self.graphs:
            if g.width == width:
                return g
        raise ManifestError(f"{self.role} model has no graph of width {width} (has {self.widths()}); "
                            "re-export with a larger --k")


@dataclass(frozen=True)
class HeadsSpec:
    role: str  # "medusa"
    precision: str  # "fp32" | "fp16" | "int4"
    n_heads: int  # K: tokens drafted per call (head i drafts i + 2 places past its feature)
    hidden_size: int  # feature width (the target's hidden size)
    vocab_size: int  # draft vocabulary Vd (the logits width; map with d2t)
    file: str  # ONNX graph: features [1, H] -> logits [K, Vd]
    weights_file: str  # external data file of the graph
    weights: dict[str, WeightSpec]  # initializer index into weights_file
    d2t: WeightSpec  # draft-vocabulary id -> target id (int64 [Vd])
    validation: dict = field(default_factory=dict)  # max |ORT - PyTorch| at export


@dataclass(frozen=True)
class Manifest:
    folder: Path  # where manifest.json lives
    name: str  # engine name
    max_len: int  # context slots in the KV buffers
    kv_bucket: int  # the "S" axis is fed in multiples of this
    prefill_chunk: int  # prompt tokens per prefill call
    num_speculative_tokens: int  # largest k the verify graphs support
    tokenizer_file: str  # tokenizer.json (HF tokenizers format)
    chat_template: str | None  # jinja2 template text, or None
    eos_token_ids: tuple[int, ...]  # generation stops on any of these
    bos_token_id: int | None  # beginning-of-sequence id
    target: ModelSpec  # the model whose output is reproduced
    draft: ModelSpec | None  # separate draft model, when exported
    eagle: ModelSpec | None  # EAGLE head, when exported
    medusa: HeadsSpec | None  # Medusa heads, when exported
    eagle_fused: ModelSpec | None  # the target graph with the EAGLE head appended (FUSED_PREFIX names), when exported
    source: dict  # where the target came from (kind, path, sha256)
    defaults: dict  # drafter / k chosen at export or by `edgespec tune`
    raw: dict  # the whole JSON, for tools

    def path(self, rel: str) -> Path:
        return self.folder / rel


def _tensor(d: dict) -> TensorSpec:
    return TensorSpec(d["name"], tuple(d["shape"]), d["dtype"])


def _weight(v: dict) -> WeightSpec:
    return WeightSpec(v["dtype"], tuple(v["shape"]), v["offset"], v["nbytes"], v.get("file"))


def _model(d: dict, role: str) -> ModelSpec:
    a = d["architecture"]
    return ModelSpec(
        role=role, kind=d["kind"], precision=d["precision"], n_layers=a["n_layers"],
        n_kv_heads=a["n_kv_heads"], head_dim=a["head_dim"], hidden_size=a["hidden_size"],
        vocab_size=a["vocab_size"], kv_dtype=d["kv_dtype"], weights_file=d["weights"]["file"],
        weights={k: _weight(v) for k, v in d["weights"]["tensors"].items()},
        graphs=tuple(GraphSpec(g["phase"], g["width"], g["file"], tuple(map(_tensor, g["inputs"])),
                               tuple(map(_tensor, g["outputs"]))) for g in d["graphs"]),
        validation=d.get("validation", {}), d2t=_weight(d["d2t"]) if "d2t" in d else None)


def _heads(d: dict, role: str) -> HeadsSpec:
    a = d["architecture"]
    return HeadsSpec(role=role, precision=d["precision"], n_heads=a["n_heads"], hidden_size=a["hidden_size"],
                     vocab_size=a["vocab_size"], file=d["graph"]["file"], weights_file=d["weights"]["file"],
                     weights={k: _weight(v) for k, v in d["weights"]["tensors"].items()}, d2t=_weight(d["d2t"]),
                     validation=d.get("validation", {}))


def load_manifest(folder: str | Path) -> Manifest:
    """Read and check an engine folder's manifest; every failure says what to do."""
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
    if d.get("format") != FORMAT:
        raise ManifestError(f"{mf}: format {d.get('format')!r}, expected {FORMAT!r}")
    if d.get("version") != VERSION:
        raise ManifestError(f"{mf}: manifest version {d.get('version')} but this edgespec reads version "
                            f"{VERSION}. Hint: re-export with this edgespec, or install the matching one.")
    try:
        target = _model(d["models"]["target"], "target")
        draft = _model(d["models"]["draft"], "draft") if "draft" in d["models"] else None
        eagle = _model(d["models"]["eagle"], "eagle") if "eagle" in d["models"] else None
        medusa = _heads(d["models"]["medusa"], "medusa") if "medusa" in d["models"] else None
        fused = _model(d["models"]["eagle_fused"], "eagle_fused") if eagle and "eagle_fused" in d["models"] else None
        tok = d["tokenizer"]
        chat = (folder / tok["chat_template_file"]).read_text() if tok.get("chat_template_file") else None
        m = Manifest(
            folder=folder, name=d["name"], max_len=d["max_len"], kv_bucket=d["kv_bucket"],
            prefill_chunk=d["prefill_chunk"], num_speculative_tokens=d["num_speculative_tokens"],
            tokenizer_file=tok["file"], chat_template=chat, eos_token_ids=tuple(tok["eos_token_ids"]),
            bos_token_id=tok.get("bos_token_id"), target=target, draft=draft, eagle=eagle,
            medusa=medusa, eagle_fused=fused, source=d.get("source", {}),
            defaults=d.get("defaults", {}), raw=d)
    except (KeyError, TypeError) as e:
        raise ManifestError(f"{mf} lacks or mistypes field {e}; re-run `edgespec export`") from e
    for spec in filter(None, (m.target, m.draft, m.eagle, m.eagle_fused)):
        for rel in [spec.weights_file] + [g.file for g in spec.graphs] + sorted(
                {w.file for w in spec.weights.values() if w.file}):
            if not (folder / rel).exists():
                raise ManifestError(f"{folder}: {spec.role} file {rel} listed in the manifest is missing")
        if 1 not in spec.widths():
            raise ManifestError(f"{folder}: {spec.role} model has no decode graph (width 1)")
    if fused is not None and (fused.widths() != target.widths() or fused.vocab_size != target.vocab_size):
        raise ManifestError(f"{folder}: the fused target+EAGLE graph has widths {fused.widths()}, the target "
                            f"{target.widths()}; re-export")
    if draft is not None and draft.vocab_size != target.vocab_size:
        raise ManifestError(f"draft vocab {draft.vocab_size} != target vocab {target.vocab_size}")
    if eagle is not None:
        if eagle.d2t is None or eagle.d2t.shape != (eagle.vocab_size,):
            raise ManifestError(f"{folder}: EAGLE head without a d2t map of {eagle.vocab_size} entries; re-export")
        if eagle.hidden_size != target.hidden_size:
            raise ManifestError(f"{folder}: EAGLE head hidden size {eagle.hidden_size} != target's "
                                f"{target.hidden_size}; re-export with a head trained for this target")
    if medusa is not None:
        for rel in sorted({medusa.file, medusa.weights_file}):
            if not (folder / rel).exists():
                raise ManifestError(f"{folder}: medusa file {rel} listed in the manifest is missing")
        if medusa.d2t.shape != (medusa.vocab_size,):
            raise ManifestError(f"{folder}: Medusa heads without a d2t map of {medusa.vocab_size} entries; re-export")
        if medusa.hidden_size != target.hidden_size:
            raise ManifestError(f"{folder}: Medusa heads of hidden size {medusa.hidden_size} != target's "
                                f"{target.hidden_size}; re-export with heads trained for this target")
    if not (folder / m.tokenizer_file).exists():
        raise ManifestError(f"{folder}: tokenizer file {m.tokenizer_file} is missing")
    return m
