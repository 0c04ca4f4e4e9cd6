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
    from edgespec.engines.manifest_checks import check, check_files

    check(m)
    return check_files(m, verify) if files else m


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


def memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
