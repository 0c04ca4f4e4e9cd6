"""The checks of a loaded manifest (engines/manifest.py load_manifest runs them): its numbers in range
and agreeing with each other before anything is sized by them, its dtypes ones numpy and the engines
know, and its files as recorded. Each failure names the field and what to do, in one line."""

from __future__ import annotations

import dataclasses
import math

from edgespec.engines.base import EngineError
from edgespec.engines.manifest import (
    DTYPES,
    KV_DTYPES,
    WEIGHT_DTYPES,
    HeadsSpec,
    Manifest,
    ManifestError,
    ModelSpec,
    check_decode,
    memory_bytes,
)


def check(m: Manifest) -> None:
    """The models fit together and the chat template exists (the models' files: _check_files)."""
    _check_numbers(m)
    check_decode(m, m.target)
    for sec in m.drafters.values():
        sec.check(m)
    for rel in filter(None, (m.chat_template_file,)):  # the tokenizer's: _check_files
        if not (m.folder / rel).exists():
            raise ManifestError(f"{m.folder}: tokenizer file {rel} is missing")


def check_files(m: Manifest, verify: bool) -> Manifest:
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


def _edited(m: Manifest, what: str, why: str) -> ManifestError:
    """The error for a field whose value cannot be right (an edited or damaged manifest.json)."""
    return ManifestError(
        f"{m.folder}: the folder's manifest.json says {what}, {why}. Hint: re-export the folder "
        f"(edgespec export --out {m.folder} --force) or fix the field"
    )


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
    _check_context(m)
    _check_ids(m)


def _check_context(m: Manifest) -> None:
    """Every call of the target fits the folder's context (the start-up probe runs each verify width at
    position 0), attention reads it in whole buckets, and the rotary tables cover it."""
    t = m.target
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


def _check_ids(m: Manifest) -> None:
    """The special ids index the target's vocabulary (the tokenizer and the stop check read with them),
    and its graph's declared outputs are as wide as its arch numbers (the buffers are sized by them)."""
    t = m.target
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


def check_graph_outputs(m: Manifest, spec: ModelSpec, session) -> None:
    """A loaded session's fixed output sizes are the ones the engine's buffers are sized with (the
    manifest's arch numbers): an edited manifest.json is named here, not by ONNX Runtime's shape
    error at the first call."""
    expect = {  # output -> axis -> (the manifest's number, its name)
        "logits": {-1: (spec.vocab_size, "vocab_size")},
        "hidden": {-1: (spec.hidden_size, "hidden_size")},
        "new_kv": {0: (spec.n_layers, "n_layers"), -1: (spec.kv_width, "n_kv_heads x head_dim")},
    }
    for out in session.get_outputs():
        for axis, (value, name) in expect.get(out.name, {}).items():
            dims = out.shape or []
            got = dims[axis] if -len(dims) <= axis < len(dims) else None
            if isinstance(got, int) and got != value:
                raise EngineError(
                    f"{m.folder}: the folder's manifest.json says {spec.role} {name} = {value}, but "
                    f"{spec.graph.file}'s {out.name} output has {got} there. Hint: re-export the folder "
                    f"(edgespec export --out {m.folder} --force) or fix the field"
                )
