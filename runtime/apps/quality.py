"""`edgespec quality`: how faithful an engine folder is to a reference, on held-out text.

Every model runs teacher-forced over the same token ids (windows of the reference folder's context,
prefill-chunk calls), and each position's next-token distribution is compared with the reference's:
top-1 agreement (the share of positions where both pick the same token: greedy decoding follows the
argmax, so this decides whether outputs diverge), the mean KL(reference || model), and each model's
perplexity on the text itself.

A model is an engine folder (its target on ONNX Runtime) or a .gguf file, which runs on llama.cpp
(llama-cpp-python, its own kernels: what a user comparing with llama.cpp on the same file sees). So
`edgespec quality engines/int4 model.gguf --reference engines/fp32` measures the int4 folder and
llama.cpp against the fp32 export of the same GGUF, as docs/results/gguf-exact.md does.

Use text that no training prompt or eval came from (the default: the Apache-2.0 licence text and a
Python standard-library module, as found on this machine).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgespec.runtime.files import input_file, output_file, read_text

DEFAULT_TEXTS = ("/usr/share/common-licenses/Apache-2.0", "textwrap.py")  # the second: found in the stdlib


class QualityError(ValueError):
    """A model or text that cannot be measured (the message says which and what to do)."""


@dataclass(frozen=True)
class QualityRow:
    folder: str  # the model measured: an engine folder or a .gguf file (llama.cpp)
    precision: str  # its target's precision ("llama.cpp" for a GGUF)
    graph: str  # its graph flavour ("gguf" for llama.cpp)
    top1_agreement: float  # share of positions whose argmax is the reference's
    kl_to_reference: float  # mean KL(reference || model) in nats
    perplexity: float  # exp(mean negative log-likelihood of the text's next tokens)


def default_texts() -> list[Path]:
    import sysconfig

    out = [Path(DEFAULT_TEXTS[0])] if Path(DEFAULT_TEXTS[0]).exists() else []
    return out + [Path(sysconfig.get_paths()["stdlib"]) / DEFAULT_TEXTS[1]]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def folder_logprobs(folder: str, ids: np.ndarray, window: int) -> np.ndarray:
    """The log-softmax rows [n-1, V] of a folder's target predicting ids[1:], teacher-forced in
    windows of `window` + 1 tokens (each window from an empty cache), prefill-chunk calls."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    m = load_manifest(folder)
    if window > m.max_len - 1:
        raise QualityError(f"{folder} holds {m.max_len} context slots; the reference's windows need {window + 1}")
    eng = OrtModel(m, m.target)
    rows = []
    for w0 in range(0, len(ids) - 1, window):
        seg = ids[w0 : w0 + window + 1]
        past = 0
        while past < len(seg) - 1:
            n = min(m.prefill_chunk, len(seg) - 1 - past)
            rows.append(_log_softmax(eng.forward(seg[past : past + n], past)[:n]).astype(np.float32))
            eng.commit(past, n)
            past += n
    return np.concatenate(rows)


def gguf_logprobs(path: str, ids: np.ndarray, window: int) -> np.ndarray:
    """folder_logprobs for a GGUF on llama.cpp (llama-cpp-python), the same windows and ids."""
    try:
        from llama_cpp import Llama
    except ImportError:
        raise QualityError(
            f"{path}: measuring a GGUF runs it on llama.cpp, which needs llama-cpp-python (pip install "
            "llama-cpp-python; it compiles llama.cpp, minutes). Hint: or export the GGUF with "
            "`edgespec export --precision fp32` and pass that folder"
        ) from None
    llm = Llama(model_path=path, n_ctx=window + 1, logits_all=True, verbose=False)
    if llm.n_vocab() <= int(ids.max()):
        raise QualityError(
            f"{path}: its vocabulary ({llm.n_vocab()}) does not hold the text's ids (another tokenizer?)"
        )
    rows = []
    for w0 in range(0, len(ids) - 1, window):
        seg = ids[w0 : w0 + window + 1]
        llm.reset()
        llm.eval([int(t) for t in seg[:-1]])
        rows.append(_log_softmax(np.asarray(llm.scores[: len(seg) - 1], np.float32)).astype(np.float32))
    return np.concatenate(rows)


def _same_tokenizer(first: str, m0, other: str, m, raw: list[str], ids: np.ndarray) -> None:
    """QualityError unless folder `other` reads the text as the same ids as folder `first` (whose
    tokenizer made `ids`): models of another vocabulary cannot be compared position by position
    (their ids past the vocabulary would fail in the graph's Gather)."""
    from edgespec.runtime.text import TextCodec

    v0, v = m0.target.vocab_size, m.target.vocab_size
    if v != v0:
        raise QualityError(
            f"{other}: a vocabulary of {v:,} ids, {first}'s has {v0:,}: quality compares models of one "
            "tokenizer (exports of the same model). Hint: pass a reference exported from the same model"
        )
    if m.path(m.tokenizer_file).read_bytes() == m0.path(m0.tokenizer_file).read_bytes():
        return
    theirs = np.concatenate([TextCodec(m).encode(t) for t in raw])[: len(ids)]
    if not np.array_equal(theirs, ids):
        n = min(len(theirs), len(ids))
        at = int(np.flatnonzero(theirs[:n] != ids[:n])[0]) if (theirs[:n] != ids[:n]).any() else n
        raise QualityError(
            f"{other}: its tokenizer reads the text as other ids than {first}'s (from token {at}): quality "
            "compares models of one tokenizer. Hint: pass a reference exported from the same model"
        )


def _describe(model: str) -> tuple[str, str]:
    """(precision, graph) of a model for its row."""
    if model.endswith(".gguf"):
        return "llama.cpp", "gguf"
    from edgespec.engines.manifest import load_manifest

    m = load_manifest(model)
    return m.target.precision, m.target.graph.flavour


def measure(models: list[str], reference: str, texts: list[Path], max_tokens: int) -> tuple[int, list[QualityRow]]:
    """(tokens measured, one row per model, the reference's first). The text is tokenized with the
    reference folder's tokenizer (or, for a GGUF reference, the first folder's)."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.text import TextCodec

    folders = [m for m in [reference, *models] if not m.endswith(".gguf")]
    if not folders:
        raise QualityError("give at least one engine folder: its tokenizer turns the text into ids")
    for model in [reference, *models]:
        if model.endswith(".gguf"):  # (a FIFO or a device named .gguf would hang llama.cpp's reader)
            input_file(model, "--reference" if model == reference else "model")
    raw = [read_text(t, "--text") for t in texts]
    manifests = {f: load_manifest(f) for f in folders}  # every folder read before the first model runs
    codec_folder = manifests[folders[0]]
    codec = TextCodec(codec_folder)
    ids = np.concatenate([codec.encode(t) for t in raw])[:max_tokens].astype(np.int64)
    if len(ids) < 2:
        raise QualityError(f"the text holds {len(ids)} tokens; give more text")
    for f in folders[1:]:
        _same_tokenizer(folders[0], codec_folder, f, manifests[f], raw, ids)
    window = codec_folder.max_len - 1

    def run(model: str) -> np.ndarray:
        return gguf_logprobs(model, ids, window) if model.endswith(".gguf") else folder_logprobs(model, ids, window)

    ref = run(reference)
    ref_top, p_ref = ref.argmax(axis=1), np.exp(ref.astype(np.float64))
    rows = []
    for model in [reference] + [m for m in models if m != reference]:
        full = ref if model == reference else run(model)
        precision, graph = _describe(model)
        rows.append(
            QualityRow(
                folder=model,
                precision=precision,
                graph=graph,
                top1_agreement=float((full.argmax(axis=1) == ref_top).mean()),
                kl_to_reference=float((p_ref * (ref - full)).sum(axis=1).mean()),
                perplexity=float(np.exp(-full[np.arange(len(full)), ids[1:]].astype(np.float64).mean())),
            )
        )
    return len(ids), rows


def table(n_tokens: int, texts: list[Path], reference: str, rows: list[QualityRow]) -> str:
    width = max(40, *(len(r.folder) for r in rows))
    lines = [
        f"{n_tokens} tokens of {', '.join(t.name for t in texts)}; reference {reference}",
        f"{'model':{width}} {'precision':>9} {'graph':>8} {'top-1 agree':>12} {'KL(ref||x)':>11} {'perplexity':>11}",
    ]
    for r in rows:
        lines.append(
            f"{r.folder:{width}} {r.precision:>9} {r.graph:>8} {r.top1_agreement:12.4f} "
            f"{r.kl_to_reference:11.5f} {r.perplexity:11.3f}"
        )
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument(
        "models", nargs="+", metavar="FOLDER_OR_GGUF", help="engine folders (or .gguf files: llama.cpp) to measure"
    )
    p.add_argument(
        "--reference",
        required=True,
        metavar="FOLDER_OR_GGUF",
        help="what the others are compared with: an engine folder (e.g. the fp32 export) or a .gguf (llama.cpp)",
    )
    p.add_argument("--text", nargs="*", help="held-out text files (default: the licence text and a stdlib module)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens of text used (default 2048)")
    p.add_argument("--json", help="also write the rows as JSON here")


def run_command(a) -> int:
    """`edgespec quality` (and tools/quality.py): measure, print the table, write --json."""
    if a.max_tokens < 2:
        raise QualityError(f"--max-tokens {a.max_tokens}: give at least 2")
    texts = [Path(t) for t in a.text] if a.text else default_texts()
    if a.json:
        output_file(a.json, "--json")  # (before minutes of measuring)
    n, rows = measure(a.models, a.reference, texts, a.max_tokens)
    print(table(n, texts, a.reference, rows))
    if a.json:
        record = {"tokens": n, "texts": [str(t) for t in texts], "reference": a.reference}
        Path(a.json).write_text(json.dumps(record | {"rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    sys.exit(run_command(parser.parse_args()))
