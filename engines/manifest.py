"""manifest.json: the contract between `edgespec export` and the runtime (torch-free).

This module is the only reader and the only writer of manifest.json. Export builds a `Manifest`
and saves it; `edgespec tune` and `edgespec build-trt` load it, `dataclasses.replace` a field and
save it again. Everything the runtime needs is written here; nothing is inferred from file names.

Each model has one ONNX graph fed at several static token widths T; its inputs and outputs are
declared once, with the symbolic axes TOKENS ("T": the call's width) and WINDOW ("S": the cache
slots read), and the per-layer KV inputs as one templated entry.

The target is core; every drafter that ships models writes its own typed section under
`drafters` (a dataclass owned by the drafter's module, registered here with `drafter_section`),
and every section is written and read by the same generic code (engines/serial.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from edgespec.engines.serial import Serial, from_json, to_json
from edgespec.engines.specs import (  # noqa: F401 (re-exported: the manifest's vocabulary)
    KV_KINDS,
    TOKENS,
    WINDOW,
    Architecture,
    GraphSpec,
    HeadInfo,
    HeadsSpec,
    ManifestError,
    ModelSpec,
    TensorSpec,
    TrtInfo,
    WeightOrigin,
    WeightSpec,
)

FORMAT = "edgespec.engine"
VERSION = 3  # raised whenever a reader of the previous layout would misread the new one
MANIFEST = "manifest.json"
PHASES = ("prefill", "decode", "verify")
FUSED_PREFIX = "eagle/"  # the EAGLE head's inputs/outputs/weights inside the fused target+head graph
# numpy dtype names a manifest may give a tensor or weight (what export writes, and their plain relatives);
# any other name is an edit or a corruption, which np.dtype() would meet as a TypeError deep in loading
DTYPES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8}
DTYPES |= {"uint64": 8, "float16": 2, "float32": 4, "float64": 8}  # name -> bytes per element
KV_DTYPES = ("float16", "float32")  # what export writes the KV cache in (the graphs' activation dtype)
# a weight may also be bf16 (an embedding every value of which is one: export/target/quant/linears.py); numpy
# has no such dtype, so the engines hand its bits to ONNX Runtime typed (engines/session.py), never to np.dtype
WEIGHT_DTYPES = DTYPES | {"bfloat16": 2}


@dataclass(frozen=True)
class FileRecord(Serial):
    size: int  # bytes, as export wrote the file (checked at every load: a stat)
    sha256: str  # hex digest (checked with --verify and by `edgespec check`: reads the whole file)


def sha256_of_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Source(Serial):
    kind: str  # "default" | "hf" | "gguf" | "hub"
    path: str  # folder, .gguf file or hub id the target was read from
    sha256: str | None  # of the GGUF file or the HF folder's weights (None for a hub id)
    draft: str | None  # the --draft the folder was exported with


@dataclass(frozen=True)
class Tuned(Serial):
    date: str  # ISO date of the `edgespec tune` run
    prompts: str | None  # the prompts file it ran on (None: HumanEval)
    n_prompts: int  # prompts it ran on
    prefill_share: float  # prefill's share of plain decoding time
    speedup_vs_none: float  # the chosen setting's tok/s over plain decoding's
    tokens_per_s: float  # the chosen setting's tok/s
    machine: str  # the CPU it ran on
    table: str  # the comparison table the choice was made from


@dataclass(frozen=True)
class Defaults(Serial):
    k: int  # num_speculative_tokens when the user gives none
    adaptive: bool  # adapt k to the acceptance rate when the user does not say
    drafter: str = "ngram"  # drafter when the user gives none
    options: dict[str, object] = field(default_factory=dict)  # drafter options (RuntimeConfig field -> value)
    #                                                             the folder sets; absent: the runtime's default
    tuned: Tuned | None = None  # how `edgespec tune` chose these; None: export's defaults


class DrafterSection(Protocol):
    """What a drafter's manifest section (a frozen dataclass in the drafter's own module) offers."""

    def models(self) -> dict[str, ModelSpec | HeadsSpec]:
        """role -> spec of every model the section ships (files are checked per role)."""
        ...

    def check(self, m: Manifest) -> None:
        """Raise ManifestError when the section does not fit the folder's target."""
        ...


SECTIONS: dict[str, type] = {}  # drafter name -> the dataclass of its section (drafter_section fills it)
_FILLERS: list = []  # what fills SECTIONS before a manifest is read (sections_from)


def drafter_section(name: str):
    """Class decorator: the manifest section of drafter `name` (its key under "drafters")."""

    def register(cls: type) -> type:
        SECTIONS[name] = cls
        return cls

    return register


def sections_from(fill) -> None:
    """`fill()` registers every drafter's section (drafter_section) and is called before a manifest
    is read. The drafter registry hands itself in when it is imported: this reader, a layer below
    it, names no drafter and imports nothing of the runtime."""
    if fill not in _FILLERS:
        _FILLERS.append(fill)


def _sections(d: dict, folder) -> None:
    """Every section the manifest names registered, or a ManifestError naming those that are not."""
    for fill in _FILLERS:
        fill()
    drafters = d.get("drafters")
    unknown = sorted(set(drafters) - set(SECTIONS)) if isinstance(drafters, dict) else []
    if unknown:
        raise ManifestError(
            f"{folder}: the manifest ships drafter section(s) {', '.join(map(repr, unknown))} that no registered "
            f"drafter reads (known: {', '.join(sorted(SECTIONS)) or 'none'}). Hint: import edgespec.runtime.drafters "
            "before reading a folder (its registry registers the sections), or re-export the folder with this "
            "edgespec"
        )


@dataclass(frozen=True)
class Manifest:
    folder: Path = field(metadata={"json": False})  # where manifest.json lives (not written: the folder may move)
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
    defaults: Defaults  # drafter / k chosen at export or by `edgespec tune`
    drafters: dict[str, object] = field(default_factory=dict, metadata={"registry": SECTIONS})  # drafter name ->
    #                                      its section (the models it ships); model-free drafters have none
    files: dict[str, FileRecord] = field(default_factory=dict)  # file -> size and sha256 as exported
    export_probe: dict = field(default_factory=dict)  # --precision auto: the candidates' width tables on the
    #   exporting CPU and the choice (export/target/checks/probe.py); {}: none
    head_fit: dict = field(default_factory=dict)  # the heads' step-1 acceptance against this target and prompt
    #                                       lookup's, on the built-in check prompts (export/fit.py); {}: not checked
    problems: dict[str, str] = field(default_factory=dict, compare=False, metadata={"json": False})  # section ->
    #                                      why its files cannot be used (set by load_manifest, never written)
    kv_cache_dtype: str | None = field(default=None, compare=False, metadata={"json": False})  # the KV caches'
    #                                      dtype chosen at load (engines/context.py; never written); None: kv_dtype

    def path(self, rel: str) -> Path:
        return self.folder / rel

    def section(self, name: str):
        """Drafter `name`'s section, or None when the folder ships none."""
        return self.drafters.get(name)

    def models(self) -> dict[str, ModelSpec | HeadsSpec]:
        """role -> spec of every model the folder holds, target first."""
        out = {"target": self.target}
        for sec in self.drafters.values():
            out |= sec.models()
        return out

    def replace_model(self, role: str, spec: ModelSpec | HeadsSpec | None) -> Manifest:
        """This manifest with model `role` replaced by spec (None: an optional model left out)."""
        if role == "target":
            return dataclasses.replace(self, target=spec)
        for name, sec in self.drafters.items():
            for f in dataclasses.fields(sec):
                old = getattr(sec, f.name)
                if isinstance(old, ModelSpec | HeadsSpec) and old.role == role:
                    new = dataclasses.replace(sec, **{f.name: spec})
                    return dataclasses.replace(self, drafters=self.drafters | {name: new})
        raise KeyError(f"no model of role {role!r} in {self.folder}")

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
        return dataclasses.replace(
            self, files={rel: FileRecord(self.path(rel).stat().st_size, sha256_of_file(self.path(rel))) for rel in rels}
        )

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

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION} | to_json(self)

    @classmethod
    def from_json(cls, d: dict, folder: str | Path) -> Manifest:
        _sections(d, folder)
        return from_json(cls, {k: v for k, v in d.items() if k not in ("format", "version")}, folder=Path(folder))

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
    tokenizer is an error; one of a drafter's models lands in `problems` (by drafter section), and
    the runtime then loads the folder without that drafter. files=False skips the file checks
    (`edgespec check` reports them itself)."""
    folder = Path(folder)
    mf = folder / MANIFEST
    if not folder.is_dir():
        raise ManifestError(f"engine folder {folder} does not exist. Hint: run `edgespec export --out {folder}`")
    if not mf.exists():
        raise ManifestError(
            f"{folder} has no {MANIFEST}: not an edgespec engine folder (or an export that "
            "did not finish). Hint: re-run `edgespec export`."
        )
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
        raise ManifestError(
            f"{folder} was exported by {age} edgespec (manifest version {version}; this edgespec "
            f"reads {VERSION}). Hint: re-export: edgespec export --out {folder} --force"
        )
    try:
        m = Manifest.from_json(d, folder)
    except ManifestError:  # said in full already (a section no registered drafter reads)
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ManifestError(f"{mf} lacks or mistypes field {e}; re-run `edgespec export`") from e
    _check(m)
    return _check_files(m, verify) if files else m


def _check_files(m: Manifest, verify: bool) -> Manifest:
    """Raise for a bad file the target or the tokenizer reads; record a drafter section's in `problems`."""
    status = m.check_files(verify)
    section_of = {role: name for name, sec in m.drafters.items() for role in sec.models()}
    problems = {}
    for role, files in m.role_files().items():
        bad = [(rel, status[rel]) for rel in files if status[rel] not in ("ok", "not recorded")]
        if not bad:
            continue
        rel, what = bad[0]
        what = "listed in the manifest is missing" if what == "missing" else what
        if role in ("target", "tokenizer"):
            raise ManifestError(
                f"{m.folder}: {role} file {rel} {what}. Hint: re-export the folder "
                f"(edgespec export --out {m.folder} --force)"
            )
        problems.setdefault(section_of[role], f"{role} file {rel} {what}")
    return dataclasses.replace(m, problems=problems) if problems else m


def check_decode(m: Manifest, spec: ModelSpec) -> None:
    """A model run token by token has a decode graph (width 1)."""
    if 1 not in spec.widths():
        raise ManifestError(f"{m.folder}: {spec.role} model has no decode graph (width 1)")


def check_head(m: Manifest, spec: ModelSpec | HeadsSpec, what: str, hint: str) -> None:
    """A head's d2t map fits its vocabulary and its hidden size is the target's."""
    if spec.d2t is None or spec.d2t.shape != (spec.vocab_size,):
        raise ManifestError(f"{m.folder}: {what} without a d2t map of {spec.vocab_size} entries; re-export")
    if spec.hidden_size != m.target.hidden_size:
        raise ManifestError(
            f"{m.folder}: {what} hidden size {spec.hidden_size} != target's {m.target.hidden_size}; {hint}"
        )


def _check(m: Manifest) -> None:
    """The models fit together and the chat template exists (the models' files: _check_files)."""
    _check_numbers(m)
    check_decode(m, m.target)
    for sec in m.drafters.values():
        sec.check(m)
    for rel in filter(None, (m.chat_template_file,)):  # the tokenizer's: _check_files
        if not (m.folder / rel).exists():
            raise ManifestError(f"{m.folder}: tokenizer file {rel} is missing")


def _edited(m: Manifest, what: str, why: str) -> ManifestError:
    """The error for a field whose value cannot be right (an edited or damaged manifest.json)."""
    return ManifestError(
        f"{m.folder}: the folder's manifest.json says {what}, {why}. Hint: re-export the folder "
        f"(edgespec export --out {m.folder} --force) or fix the field"
    )


def memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _check_dtypes(m: Manifest) -> None:
    """Every dtype name is one numpy and the engines know (the loader hands them to np.dtype), and each
    weight's byte length is its shape's."""
    for role, s in m.models().items():
        io = (s.inputs, s.outputs) if isinstance(s, HeadsSpec) else (s.graph.inputs, s.graph.outputs)
        tensors = [("input", t) for t in io[0]] + [("output", t) for t in io[1]]
        if isinstance(s, ModelSpec) and s.kv_dtype not in KV_DTYPES:
            raise _edited(m, f"{role} kv_dtype {s.kv_dtype!r}", f"not one of {', '.join(KV_DTYPES)}")
        for kind, t in tensors:
            if t.dtype not in DTYPES:
                raise _edited(m, f"{role} graph {kind} {t.name} dtype {t.dtype!r}", f"not one of {', '.join(DTYPES)}")
        weights = dict(s.weights) | ({"d2t": s.d2t} if s.d2t is not None else {})
        for name, w in weights.items():
            if w.dtype not in WEIGHT_DTYPES:
                raise _edited(m, f"{role} weight {name} dtype {w.dtype!r}", f"not one of {', '.join(WEIGHT_DTYPES)}")
            n = math.prod(w.shape)
            if min(w.shape, default=0) < 0 or w.offset < 0 or w.nbytes != n * WEIGHT_DTYPES[w.dtype]:
                raise _edited(
                    m,
                    f"{role} weight {name} is {w.dtype} {list(w.shape)} at offset {w.offset}, {w.nbytes} bytes",
                    f"which do not agree ({list(w.shape)} of {w.dtype} is {n * WEIGHT_DTYPES[w.dtype]} bytes)",
                )


def _check_numbers(m: Manifest) -> None:
    """The manifest's numbers are in range before anything is sized by them: an edited max_len, id or
    dtype would otherwise surface as an IndexError, OverflowError, TypeError or a huge allocation
    deep in loading. The JSON reader (engines/serial.py) has made ints ints and bools bools already."""
    t = m.target
    for name in ("max_len", "kv_bucket", "prefill_chunk", "num_speculative_tokens"):
        if getattr(m, name) < 1:
            raise _edited(m, f"{name} = {getattr(m, name)}", "it must be >= 1")
    for role, s in m.models().items():
        model = isinstance(s, ModelSpec)
        arch, sizes = (s.arch, ("n_layers", "n_heads", "n_kv_heads", "head_dim")) if model else (s, ())
        for name in sizes + ("hidden_size", "vocab_size"):
            if getattr(arch, name) < 1:
                raise _edited(m, f"{role} {name} = {getattr(arch, name)}", "it must be >= 1")
        if isinstance(s, ModelSpec) and min(s.graph.widths, default=0) < 1:
            raise _edited(m, f"{role} graph widths {list(s.graph.widths)}", "every width must be >= 1")
    _check_dtypes(m)

    # the context: every call of the target must fit it (the start-up probe runs each verify width at
    # position 0), and attention reads it in whole buckets
    widest = max(t.graph.widths, default=1)
    if m.prefill_chunk not in t.graph.widths:
        raise _edited(m, f"prefill_chunk = {m.prefill_chunk}", f"but the target graph has no such width {t.widths()}")
    need = max(widest, m.num_speculative_tokens + 2)  # export's rule: k + 2 leaves room for a verify call
    if m.max_len < need:
        raise _edited(
            m,
            f"max_len = {m.max_len}",
            f"but its own graphs need at least {need} (the target's widest call is {widest} tokens: prefill "
            f"chunk {m.prefill_chunk}, verify widths up to k + 1 = {m.num_speculative_tokens + 1})",
        )
    if m.max_len % m.kv_bucket:
        raise _edited(m, f"max_len = {m.max_len}", f"not a multiple of kv_bucket = {m.kv_bucket}")
    # positions past the target's rope tables have no rotation to read (export writes max_len rows)
    for name, w in t.weights.items():
        if name.startswith("rope_cos") and w.shape and m.max_len > w.shape[0]:
            raise _edited(
                m,
                f"max_len = {m.max_len}",
                f"but the target graph's rope table {name} covers {w.shape[0]} positions (the exported max_len)",
            )
    # a rotary table computed at load (engines/rope.py) is sized by its recorded shape: an edited one
    # could ask for more than the machine holds
    ram = memory_bytes()
    for role, s in m.models().items():
        for name, w in s.weights.items():
            if w.rope is not None and ram is not None and w.nbytes > ram // 8:  # (computing it takes ~2x its bytes)
                raise _edited(m, f"{role} rotary table {name} is {list(w.shape)}", f"{_size(w.nbytes)} to compute")
    # the KV buffers a load allocates are sized by the context it chooses (engines/context.py, which
    # refuses one this machine cannot hold), not by the folder's maximum

    # ids: the tokenizer and the stop check index the vocabulary with them
    vocab = t.vocab_size
    for what, ids in (("eos_token_ids", m.eos_token_ids), ("bos_token_id", (m.bos_token_id,))):
        bad = [i for i in ids if i is not None and not 0 <= i < vocab]
        if bad:
            shown = list(m.eos_token_ids) if what == "eos_token_ids" else m.bos_token_id
            raise _edited(m, f"{what} = {shown}", f"outside the target's vocabulary of {vocab} ids (0..{vocab - 1})")
    # the target's buffers are sized by its arch numbers; its graph's declared outputs must agree
    for out, name, value in (("logits", "vocab_size", vocab), ("hidden", "hidden_size", t.hidden_size)):
        spec = t.graph.output(out)
        if spec is not None and isinstance(spec.shape[-1], int) and spec.shape[-1] != value:
            raise _edited(
                m,
                f"target {name} = {value}",
                f"but its graph's {out} output is {spec.shape[-1]} wide (the model's {name.replace('_', ' ')})",
            )
