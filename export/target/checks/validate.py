"""Every exported graph, run through the runtime's ONNX Runtime engine, against a reference.

Each model kind supplies its calls and what they must give: the decoders here (`validate_model`),
each drafter's in its graph module (<name>_graph.validate_<name>, called by its plugin in
export/drafters/). `compare` records max |got - want| per call and refuses the export when the worst is over the
tolerance. Token graphs are fed as the runtime feeds them (`schedule`): one prefill chunk, then
every other width in turn, so each width runs at a nonzero past_len over a bucketed cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgespec.engines.context import for_checks
from edgespec.engines.manifest import ModelSpec, load_manifest
from edgespec.export.target.spec import ExportError

ORT_VS_PYTORCH = "max |ORT - PyTorch| logits"


def compare(
    name: str, calls: Iterable[tuple[str, np.ndarray, np.ndarray]], tol: float, hint: str, what: str = ORT_VS_PYTORCH
) -> dict[str, float]:
    """max |got - want| of each (label, got, want) call, taken before the next call runs; an
    ExportError naming the worst call when it is over `tol`."""
    diffs = {label: float(np.abs(got - want).max()) for label, got, want in calls}
    worst = max(diffs, key=diffs.get)
    if diffs[worst] > tol:
        raise ExportError(f"{name} at {worst}: {what} = {diffs[worst]:.3g} > tolerance {tol:g} (all: {diffs}). {hint}")
    return diffs


def schedule(spec: ModelSpec, chunk: int, n_tokens: int) -> list[tuple[str, int, int]]:
    """(label "<phase>_t<width>", past_len, width) of the calls feeding n_tokens tokens: the
    prefill chunk, then every other width once, while the tokens last."""
    calls, past = [], 0
    for w in [chunk] + [w for w in spec.widths() if w != chunk]:
        if past + w > n_tokens:
            break
        calls.append((f"{spec.graph.phase(w)}_t{w}", past, w))
        past += w
    return calls


def validation_tokens(tok, n: int, vocab: int) -> np.ndarray:
    """n token ids of mixed code and prose (a deterministic pattern for tiny test vocabularies)."""
    text = (
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n'
        "        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
        "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens cheaply "
        "and verifies them in one pass of the target model. "
    ) * 8
    ids = [i for i in tok(text)["input_ids"] if i < vocab]
    if len(ids) < n:  # tiny test vocabularies: fill with a deterministic pattern
        ids = list(np.random.default_rng(0).integers(0, vocab, n))
    return np.array(ids[:n], np.int64)


def target_features(ref_target, tokens: np.ndarray) -> np.ndarray:
    """The target's final-norm hidden states [N, H] (what heads on the last features read)."""
    import torch

    with torch.no_grad():
        return ref_target.model(torch.from_numpy(tokens[None])).last_hidden_state[0].float().numpy()


def aux_features(ref_target, tokens: np.ndarray, layers: tuple[int, ...]) -> np.ndarray:
    """The target's hidden_aux rows [N, n*H]: the residual stream entering `layers` (the aux
    features, what some drafters read)."""
    import torch

    with torch.no_grad():
        hs = ref_target.model(torch.from_numpy(tokens[None]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0] for i in layers], dim=-1).float().numpy()


def validate_model(folder: Path, role: str, ref_model, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """A target or draft graph: logits per width against the PyTorch model on the same tokens."""
    import torch

    from edgespec.engines.ort import OrtModel

    man = for_checks(load_manifest(folder))
    spec = man.models()[role]
    engine = OrtModel(man, spec)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(tokens[None])).logits[0].float().numpy()  # [N, V]

    def calls():
        for label, past, w in schedule(spec, man.prefill_chunk, len(tokens)):
            yield label, engine.forward(tokens[past : past + w], past), ref[past : past + w]
            engine.commit(past, w)

    return compare(
        f"{role} graph", calls(), tol, "The export is not trustworthy; please report it with the model config."
    )
