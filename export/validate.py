"""Every exported graph, run through the runtime's ONNX Runtime engine, against a reference.

Each model kind supplies its calls and what they must give; `compare` records max |got - want| per
call and refuses the export when the worst is over the tolerance. Token graphs are fed as the
runtime feeds them (`schedule`): one prefill chunk, then every other width in turn, so each width
runs at a nonzero past_len over a bucketed cache.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgespec.engines.manifest import ModelSpec, load_manifest
from edgespec.export.spec import ExportError

ORT_VS_PYTORCH = "max |ORT - PyTorch| logits"


def compare(name: str, calls: Iterable[tuple[str, np.ndarray, np.ndarray]], tol: float, hint: str,
            what: str = ORT_VS_PYTORCH) -> dict[str, float]:
    """max |got - want| of each (label, got, want) call, taken before the next call runs; an
    ExportError naming the worst call when it is over `tol`."""
    diffs = {label: float(np.abs(got - want).max()) for label, got, want in calls}
    worst = max(diffs, key=diffs.get)
    if diffs[worst] > tol:
        raise ExportError(f"{name} at {worst}: {what} = {diffs[worst]:.3g} > tolerance {tol:g} (all: {diffs}). "
                          f"{hint}")
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
    text = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
            "        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
            "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens cheaply "
            "and verifies them in one pass of the target model. ") * 8
    ids = [i for i in tok(text)["input_ids"] if i < vocab]
    if len(ids) < n:  # tiny test vocabularies: fill with a deterministic pattern
        ids = list(np.random.default_rng(0).integers(0, vocab, n))
    return np.array(ids[:n], np.int64)


def _features(ref_target, tokens: np.ndarray) -> np.ndarray:
    """The target's final-norm hidden states [N, H] (what EAGLE and Medusa heads read)."""
    import torch

    with torch.no_grad():
        return ref_target.model(torch.from_numpy(tokens[None])).last_hidden_state[0].float().numpy()


def validate_model(folder: Path, role: str, ref_model, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """A target or draft graph: logits per width against the PyTorch model on the same tokens."""
    import torch

    from edgespec.engines.ort import OrtModel

    man = load_manifest(folder)
    spec = man.models()[role]
    engine = OrtModel(man, spec)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(tokens[None])).logits[0].float().numpy()  # [N, V]

    def calls():
        for label, past, w in schedule(spec, man.prefill_chunk, len(tokens)):
            yield label, engine.forward(tokens[past:past + w], past), ref[past:past + w]
            engine.commit(past, w)

    return compare(f"{role} graph", calls(), tol, "The export is not trustworthy; please report it with the "
                   "model config.")


def validate_eagle(folder: Path, ew, ref_target, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """The EAGLE head graph against the PyTorch head (same dequantized weights) on the target's
    real features, per width."""
    import torch

    from edgespec.engines.ort import OrtModel
    from edgespec.export.eagle_head import build_head

    man = load_manifest(folder)
    engine = OrtModel(man, man.models()["eagle"])
    feats = _features(ref_target, tokens)  # [N, H]
    ref_arrays = dict(ew.reference) | {"fc.bias": ew.store.arrays["fc_b"].astype(np.float32), "d2t": ew.d2t,
                                       "layers.0.post_attention_layernorm.weight":
                                           ew.store.arrays["l0.ln2"].astype(np.float32)}
    if ew.head_cfg.input_layernorm:
        ref_arrays["layers.0.input_layernorm.weight"] = ew.store.arrays["l0.ln1"].astype(np.float32)
    if ew.head_cfg.final_norm:
        ref_arrays["norm.weight"] = ew.store.arrays["final_norm"].astype(np.float32)
    cos, sin = ew.arch.rope_tables()
    embed = ref_target.model.embed_tokens.weight.detach().float().numpy()
    head = build_head(ew.head_cfg, ref_arrays, embed, np.zeros_like(embed), cos, sin)
    head.lm_head = torch.from_numpy(ew.reference["lm_head_d"])  # the rows the graph uses (int4: dequantized)
    n = len(tokens) - 1  # the head reads token j+1 beside feature j
    with torch.no_grad():
        pred = head(torch.from_numpy(tokens[1:][None]), torch.from_numpy(feats[:n][None]),
                    torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool), n_steps=1)[0]
        ref = head.logits(pred)[0].numpy()  # [n, Vd]

    def calls():
        for label, past, w in schedule(man.models()["eagle"], man.prefill_chunk, n):
            got = engine.forward(tokens[1 + past:1 + past + w], past, features=feats[past:past + w])
            yield label, got, ref[past:past + w]
            engine.commit(past, w)

    return compare("EAGLE head graph", calls(), tol, "Please report it with the head's config.json.")


class _NotBitwise(Exception):
    """The fused graph's target logits differ from the plain target's."""


def validate_fused(folder: Path, tokens: np.ndarray, tol: float) -> dict[str, float] | None:
    """The fused graph against the plain target and the standalone head, call by call at every
    width: its target logits must be BITWISE the plain graph's (greedy eagle output = plain output
    rests on it), its head logits close to the head's own graph. None (with a warning) if the
    target part differs: the folder then runs EAGLE with separate head calls."""
    from edgespec.engines.ort import OrtModel

    man = load_manifest(folder)
    plain, head = OrtModel(man, man.target), OrtModel(man, man.models()["eagle"])
    fused = OrtModel(man, man.models()["eagle_fused"], head=OrtModel(man, man.models()["eagle"]))

    def calls():
        for label, past, w in schedule(man.target, man.prefill_chunk, len(tokens)):
            ids, nxt = tokens[past:past + w], tokens[past + 1:past + w + 1]
            n = len(nxt)  # rows whose next token is known (the very last row's is not)
            want = plain.forward(ids, past).copy()
            got = fused.forward(ids, past, head_next=nxt)
            if not np.array_equal(got, want):
                raise _NotBitwise(f"the fused target+EAGLE graph's logits at {label} differ from the plain "
                                  f"target's by {np.abs(got - want).max():.3g}")
            head_want = head.forward(nxt, past, features=plain.last_hidden(n))
            yield f"head_{label}", fused.last_head_logits(n), head_want
            if n < w:
                return
            for e in (plain, head, fused):
                e.commit(past, w)

    try:
        return compare("fused target+EAGLE graph", calls(), tol, "Please report it.",
                       what="max |head logits - the head's own graph's|")
    except _NotBitwise as e:
        print(f"edgespec: warning: {e}; left out (eagle uses separate head calls)", file=sys.stderr)
        return None


def validate_medusa(folder: Path, mw, ref_target, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """The Medusa heads graph against the PyTorch heads (same dequantized weights) on 8 of the
    target's real features."""
    import torch

    from edgespec.engines.medusa import OrtHeads
    from edgespec.export.medusa_head import build_heads

    man = load_manifest(folder)
    engine = OrtHeads(man, man.models()["medusa"])
    feats = _features(ref_target, tokens)  # [N, H]
    K = mw.mc.n_heads
    arrays = dict(mw.reference) | {"d2t": mw.d2t}
    b0 = mw.store.arrays["blocks0_b"].astype(np.float32).reshape(K, -1)
    for i in range(K):
        arrays[f"{i}.0.linear.bias"] = b0[i]
        for j in range(1, mw.mc.n_layers):
            arrays[f"{i}.{j}.linear.bias"] = mw.store.arrays[f"blocks{j}_b"][i, 0].astype(np.float32)
    heads = build_heads(mw.mc, arrays, np.zeros((mw.mc.vocab_size, mw.mc.hidden_size), np.float32))
    heads.lm_head = torch.from_numpy(mw.reference["lm_head_d"])  # the rows the graph uses (int4: dequantized)
    rows = np.linspace(0, len(feats) - 1, 8).astype(int)
    with torch.no_grad():
        ref = heads.logits(heads(torch.from_numpy(feats[rows]))).numpy()  # [8, K, Vd]
    got = np.stack([engine.forward(feats[r]).copy() for r in rows])
    return compare("Medusa heads graph", [("heads", got, ref)], tol, "Please report it with the heads' config.json.")
