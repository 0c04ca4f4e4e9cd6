"""Which engine runs which model of a folder, and which drafters each backend can serve.

cpu / cuda / tensorrt are ONNX Runtime execution providers (every model of the folder runs
through them); trt is native TensorRT (`edgespec build-trt` builds the target and the draft).
Drafters that read the target's hidden states need a target engine that returns them
(`has_hidden`); native TensorRT engines give logits and KV only, and `load` refuses those
drafters there with what to use instead. Each drafter section of the folder is loaded by its
drafter's own `load` (runtime/drafters/); a section whose files are broken is left out, and only
the drafters that need it are turned off.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass, field, fields, is_dataclass

from edgespec.engines.base import Engine, EngineError
from edgespec.engines.manifest import Manifest
from edgespec.runtime.drafters import LoadContext, registry, spec_of


@dataclass
class Engines:
    """The loaded models of one folder (a section absent from `models`: not in the folder, or not on
    this backend)."""

    target: Engine  # the model whose output is reproduced
    models: dict[str, object] = field(default_factory=dict)  # drafter section -> its loaded engine(s)
    broken: dict[str, str] = field(default_factory=dict)  # drafter section -> why its files cannot be used

    def get(self, name: str):
        """Section `name`'s loaded engine(s), or None."""
        return self.models.get(name)

    def close(self) -> None:
        """Close every loaded engine: the target, and each section's (one engine, or a dataclass of
        several, e.g. a head and its fused graph). Closing twice does nothing."""
        for e in (self.target, *self.models.values()):
            parts = [getattr(e, f.name) for f in fields(e)] if is_dataclass(e) else [e]
            for part in parts:
                if callable(getattr(part, "close", None)):
                    part.close()

    def why_off(self, drafter: str, cfg) -> str | None:
        """Why drafter cannot run with these engines and cfg (a broken or missing section), else None."""
        for need in spec_of(drafter).needs(cfg):
            if need in self.broken:
                return (
                    f"drafter {drafter!r} is disabled: {self.broken[need]}. Hint: re-export the folder, or "
                    "choose another drafter"
                )
            if need not in self.models:
                return f"drafter {drafter!r} needs an engine folder exported with {spec_of(need).export_hint}"
        return None


def make_engine(manifest: Manifest, spec, provider: str, threads: int | None, cuda_graph: bool | None = None):
    """cpu / cuda / tensorrt: ONNX Runtime with that execution provider; trt: native TensorRT.
    cuda_graph: OrtModel's (CUDA graph capture on the cuda provider; None: where the folder allows)."""
    if provider == "trt":
        from edgespec.engines.trt import TrtModel

        check_native_trt(manifest, spec)
        return TrtModel(manifest, spec)
    from edgespec.engines.ort import OrtModel

    return OrtModel(manifest, spec, provider, threads, cuda_graph=cuda_graph if provider == "cuda" else False)


def check_native_trt(manifest: Manifest, spec) -> None:
    """Refuse --provider trt where it cannot start, before any GPU call: the Python packages it runs on
    (an ImportError deep in the engine otherwise), then the engine `edgespec build-trt` makes."""
    missing = [pkg for module, pkg in (("tensorrt", "tensorrt"), ("cuda", "cuda-python")) if not _importable(module)]
    if missing:
        raise EngineError(
            f"provider 'trt' (native TensorRT) needs the {' and '.join(missing)} package"
            f"{'s' * (len(missing) > 1)}, which this Python lacks, and an NVIDIA GPU. Hint: pip install "
            f"{' '.join(missing)} (NVIDIA's index) and run `edgespec build-trt --engine {manifest.folder}`, or "
            "use --provider cpu (or cuda / tensorrt: ONNX Runtime's execution providers)"
        )
    if getattr(spec, "tensorrt", None) is None:
        other = "" if spec.role == "target" else " (or run it elsewhere: --draft-provider cpu)"
        raise EngineError(
            f"{manifest.folder}: no TensorRT engine for the {spec.role} model. Hint: edgespec build-trt "
            f"--engine {manifest.folder}{other}"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module without a spec
        return False


def _disable(manifest: Manifest, name: str, why: str, broken: dict[str, str], cfg) -> None:
    """Turn off the drafters that need a broken section: one RuntimeWarning naming them."""
    broken[name] = why
    off = [d for d, s in registry().items() if name in s.needs(cfg)]
    hint = f"re-export the folder (edgespec export --out {manifest.folder} --force)"
    warnings.warn(
        f"{manifest.folder}: {why}; drafter(s) {', '.join(off)} disabled. Hint: {hint}", RuntimeWarning, stacklevel=4
    )


def make_engines(manifest: Manifest, cfg) -> Engines:
    """Every model of the folder this backend can run (sessions are made on first use). A drafter
    section whose files are broken (load_manifest's `problems`, or a weights file too short for its
    tensors) is left out with a warning: its drafters are disabled, the target still loads."""
    from edgespec.engines.ort import WeightsFileError

    target = make_engine(manifest, manifest.target, cfg.provider, cfg.threads, cfg.cuda_graph)
    out = Engines(target)
    for name, why in manifest.problems.items():
        _disable(manifest, name, why, out.broken, cfg)
    dft_provider = cfg.draft_provider or cfg.provider
    ctx = LoadContext(
        provider=cfg.provider,
        model_provider=dft_provider,
        head_provider="cpu" if dft_provider == "trt" else dft_provider,  # small graphs: ONNX Runtime
        threads=cfg.threads,
        cuda_graph=cfg.cuda_graph,
        target=target,
        cfg=cfg,
    )
    for name, section in manifest.drafters.items():
        plugin = registry().get(name)
        if name in out.broken or plugin is None:
            continue
        if (plugin.needs_features(cfg) or plugin.reads_aux) and not target.has_hidden:  # nothing to draft from
            continue
        try:
            out.models[name] = plugin.load(manifest, section, ctx)
        except WeightsFileError as e:
            _disable(manifest, name, e.why, out.broken, cfg)
    return out


def check_drafter(name: str, engines: Engines, provider: str, cfg) -> None:
    """Refuse a drafter these engines cannot serve, saying why and what to use."""
    plugin = spec_of(name)
    reads_target = plugin.needs_features(cfg) or any(spec_of(n).reads_aux for n in plugin.needs(cfg))
    if reads_target and not engines.target.has_hidden:
        raise ValueError(
            f"drafter {name!r} cannot run on provider {provider!r}: it drafts from the target's hidden "
            "states, which this backend's target engine does not return. Hint: use --provider "
            "tensorrt or cuda (ONNX Runtime) for it, or --drafter ngram / draft / none here"
        )
    why = engines.why_off(name, cfg)
    if why is not None:
        raise ValueError(why)


def runnable_drafters(engines: Engines, cfg) -> tuple[str, ...]:
    """The registered drafters these engines can serve with cfg (check_drafter accepts them), in registry order."""

    def runs(name: str) -> bool:
        try:
            check_drafter(name, engines, cfg.provider, cfg)
        except ValueError:  # disabled, missing from the folder, or not on this backend
            return False
        return True

    return tuple(name for name in registry() if runs(name))
