"""Which engine runs which model of a folder, and which drafters each backend can serve.

cpu / cuda / tensorrt are ONNX Runtime execution providers (every model of the folder runs
through them); trt is native TensorRT (`edgespec build-trt` builds the target and the draft).
The head drafters (eagle, hybrid, medusa) draft from the target's hidden states, so they need a
target engine that returns them (`has_hidden`); native TensorRT engines give logits and KV only,
and `load` refuses those drafters there with what to use instead.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from edgespec.engines.base import Engine, HeadEngine, HeadsEngine
from edgespec.engines.manifest import Manifest
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import DRAFTERS, FEATURE_DRAFTERS


@dataclass
class Engines:
    """The loaded models of one folder (None: not in the folder, or not on this backend)."""

    target: Engine  # the model whose output is reproduced
    draft: Engine | None = None  # a separate draft model
    eagle: HeadEngine | None = None  # the EAGLE head
    medusa: HeadsEngine | None = None  # the Medusa heads
    eagle_fused: Engine | None = None  # target + EAGLE head in one graph, sharing the target's KV
    eagle3: HeadEngine | None = None  # the EAGLE-3 head (drafts from the target's hidden_aux)
    dflash: object | None = None  # the DFlash block drafter (engines.dflash.OrtDFlash; reads hidden_aux)
    disabled: dict[str, str] = field(default_factory=dict)  # drafter -> why it is off (a broken optional model)

    @property
    def features_needed(self) -> bool:
        """Some drafter of these engines reads the target's hidden states."""
        return self.eagle is not None or self.medusa is not None


def make_engine(manifest: Manifest, spec, provider: str, threads: int | None, cuda_graph: bool | None = None):
    """cpu / cuda / tensorrt: ONNX Runtime with that execution provider; trt: native TensorRT.
    cuda_graph: OrtModel's (CUDA graph capture on the cuda provider; None: where the folder allows)."""
    if provider == "trt":
        from edgespec.engines.trt import TrtModel

        return TrtModel(manifest, spec)
    from edgespec.engines.ort import OrtModel

    return OrtModel(manifest, spec, provider, threads, cuda_graph=cuda_graph if provider == "cuda" else False)


# the drafters an optional model serves: a broken one turns them off, the target still loads
ROLE_DRAFTERS = {"draft": ("draft",), "eagle": ("eagle", "hybrid"), "eagle_fused": (), "medusa": ("medusa",),
                 "eagle3": ("eagle3",), "dflash": ("dflash",)}


def _disable(manifest: Manifest, role: str, why: str, disabled: dict[str, str]) -> None:
    """Turn off the drafters of a broken optional model: one RuntimeWarning, and drafter -> why."""
    drafters = ROLE_DRAFTERS[role]
    hint = f"re-export the folder (edgespec export --out {manifest.folder} --force)"
    off = f"drafter(s) {', '.join(drafters)} disabled" if drafters else "the fused target+EAGLE graph is not used"
    warnings.warn(f"{manifest.folder}: {why}; {off}. Hint: {hint}", RuntimeWarning, stacklevel=4)
    for d in drafters:
        disabled[d] = f"drafter {d!r} is disabled: {why}. Hint: {hint}, or choose another drafter"


def make_engines(manifest: Manifest, cfg: RuntimeConfig) -> Engines:
    """Every model of the folder this backend can run (sessions are made on first use). An optional
    model whose files are broken (load_manifest's `problems`, or a weights file too short for its
    tensors) is left out with a warning: its drafters are disabled, the target still loads."""
    from edgespec.engines.medusa import OrtHeads
    from edgespec.engines.ort import OrtModel, WeightsFileError

    disabled: dict[str, str] = {}
    broken = set()
    for role, why in manifest.problems.items():
        if role in ROLE_DRAFTERS and not (role == "eagle_fused" and "eagle" in manifest.problems):  # said once
            _disable(manifest, role, why, disabled)
            broken.add(role)

    def optional(role: str, make):
        if role in broken or (role == "eagle_fused" and "eagle" in broken):
            return None
        try:
            return make()
        except WeightsFileError as e:
            _disable(manifest, role, e.why, disabled)  # one hint: _disable's
            broken.add(role)
            return None

    target = make_engine(manifest, manifest.target, cfg.provider, cfg.threads, cfg.cuda_graph)
    dft_provider = cfg.draft_provider or cfg.provider
    out = Engines(target, disabled=disabled)
    if manifest.draft:  # the draft may run elsewhere (e.g. on the CPU beside a GPU target)
        out.draft = optional("draft", lambda: make_engine(manifest, manifest.draft, dft_provider, cfg.threads,
                                                          cfg.cuda_graph))
    if not target.has_hidden:  # nothing to draft from for the heads
        return out
    head_provider = "cpu" if dft_provider == "trt" else dft_provider  # small graphs: ONNX Runtime
    if manifest.eagle:
        out.eagle = optional("eagle", lambda: OrtModel(manifest, manifest.eagle, head_provider, cfg.threads))
        # the fused graph reads and writes both KV caches on the host
        if out.eagle and manifest.eagle_fused and cfg.fuse_head and cfg.provider == head_provider == "cpu":
            out.eagle_fused = optional("eagle_fused", lambda: OrtModel(
                manifest, manifest.eagle_fused, "cpu", cfg.threads, kv=target.kv, head=out.eagle))
    if manifest.eagle3:
        out.eagle3 = optional("eagle3", lambda: OrtModel(manifest, manifest.eagle3, head_provider, cfg.threads))
    if manifest.dflash:
        from edgespec.engines.dflash import OrtDFlash

        out.dflash = optional("dflash", lambda: OrtDFlash(manifest, manifest.dflash, head_provider, cfg.threads))
    if manifest.medusa:
        out.medusa = optional("medusa", lambda: OrtHeads(manifest, manifest.medusa, head_provider, cfg.threads))
    return out


def check_drafter(name: str, engines: Engines, provider: str) -> None:
    """Refuse a drafter these engines cannot serve, saying why and what to use."""
    if name not in DRAFTERS and name != "prompt_lookup":
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    if name in engines.disabled:
        raise ValueError(engines.disabled[name])
    if name in FEATURE_DRAFTERS and not engines.target.has_hidden:
        raise ValueError(f"drafter {name!r} cannot run on provider {provider!r}: it drafts from the target's hidden "
                         "states, which this backend's target engine does not return. Hint: use --provider "
                         "tensorrt or cuda (ONNX Runtime) for it, or --drafter ngram / draft / none here")
