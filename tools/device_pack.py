"""Everything the GPU check needs, made here and cut to what one `run` call of the lent machine carries.

    python tools/device_pack.py                  # .devpack/: engines, onnxruntime-gpu, edgespec's wheel, the calls
    python tools/device_pack.py --engines-only   # only .devpack/engines (what tools/device_check.sh --dry-run runs)
    python tools/device_pack.py --default-model  # also the default model's folder (about 4 more calls)

The lent machine has no network, and a call carries at most 64 MiB of working tree, tracked files
included (26 to 32 MiB here on 2026-12-05). So the onnxruntime-gpu wheel (256 MB: its CUDA provider
library alone is 284 MB unpacked) travels as pieces across consecutive calls to one warm machine:
its files are repacked as one xz tar (about 20% smaller than the wheel's deflate: fewer calls), cut
into pieces that fit beside the tree, and every call carries the next pieces plus .devpack/send/PIECES
(their sha256). tools/device_check.sh collects what each call brought in /tmp/edgespec-devpack and,
once every piece is there and checks, unpacks, installs and runs the check (its header lists the calls).
Nothing is exported there: the engine folders are exported here (device_check.py ENGINE_FOLDERS).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests")]
from device_check import ENGINE_FOLDERS, HF_FOLDER  # noqa: E402

PACK = ROOT / ".devpack"  # ignored (.gitignore): nothing here is committed
CALL_LIMIT = 64 * 2**20  # the working tree one `run` call carries (device README: Limits)
MAX_PIECE = 60 * 2**20  # the largest piece, however small the tree gets
MARGIN = 2 * 2**20  # room for files other sessions add to the tree between packing and sending
MAX_CARRY = 8  # paths one call's carry may name
# the CUDA 13 build (its CUDA provider needs libcudart.so.13, libcublas.so.13; cuDNN 9 for CUDA 13): the
# lent machines' torch is 2.11+cu130 with the nvidia-*-cu13 runtime wheels, which preload_dlls() finds
ORT_GPU = "onnxruntime-gpu==1.31.1"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class Piece:
    name: str  # file name under .devpack/send
    nbytes: int  # its size
    sha256: str  # its digest (PIECES), checked on the device before anything is joined


def travelling_bytes() -> int:
    """Bytes of the working tree a `run` call sends: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum((ROOT / p.decode()).stat().st_size for p in listed if p and (ROOT / p.decode()).is_file())


def tiny_eagle_head(hf: Path, out: Path) -> Path:
    """A random EAGLE head for the tiny model (as tests/test_eagle.py makes one): the drafter's code
    path on the GPU, not its acceptance."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    from edgespec.export.drafters.eagle.checkpoint import save_head
    from edgespec.export.drafters.eagle.head import build_head, init_arrays
    from edgespec.export.target.arch import arch_from_config

    model = AutoModelForCausalLM.from_pretrained(hf)
    arch = arch_from_config(model.config, 256)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    hc, arrays = init_arrays(arch, sd, np.arange(arch.vocab_size, dtype=np.int64), 0)
    cos, sin = arch.rope_tables()
    embed = sd["model.embed_tokens.weight"]
    save_head(build_head(hc, arrays, embed, sd.get("lm_head.weight", embed), cos, sin), out)
    return out


def export_engines(out: Path, default_model: bool = False) -> dict[str, Path]:
    """The folders of ENGINE_FOLDERS from one tiny random llama (kept as HF_FOLDER), and the default
    model's int4 folder when asked; folders already there are kept."""
    from tiny import TINY_EXPORT, make_tiny

    from edgespec.export.target.exporter import ExportConfig, export

    out.mkdir(parents=True, exist_ok=True)
    hf = out / HF_FOLDER
    if not (hf / "config.json").exists():
        make_tiny("llama", hf)
    settings = {
        "ref": dict(precision="fp32", host_prologue=True, draft="self:1", eagle="HEAD"),
        "fp16": dict(precision="fp16", draft="self:1"),
        "int4": dict(precision="int4", host_prologue=True),
    }
    made = {}
    for role, kw in settings.items():
        folder = out / role
        if not (folder / "manifest.json").exists():
            if kw.get("eagle") == "HEAD":
                kw = kw | {"eagle": str(tiny_eagle_head(hf, out / ".eagle-head"))}
            tiny = {k: v for k, v in TINY_EXPORT.items() if k != "precision"} | kw  # the tests' tiny sizes
            export(ExportConfig(target=str(hf), out=str(folder), **tiny))
        made[role] = folder
    shutil.rmtree(out / ".eagle-head", ignore_errors=True)
    if default_model and not (out / "default" / "manifest.json").exists():
        export(ExportConfig(out=str(out / "default"), precision="int4", host_prologue=True, max_len=1024, k=8))
    if (out / "default" / "manifest.json").exists():
        made["default"] = out / "default"
    assert set(made) <= set(ENGINE_FOLDERS)
    return made


def download_ort(dest: Path, requirement: str = ORT_GPU) -> Path:
    """The onnxruntime-gpu wheel for the lent machine's python 3.12 on x86-64 (pip download; kept once here)."""
    dest.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-{requirement.split('==')[-1]}-cp312-*.whl"))
    if found:
        return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--implementation", "cp", "-d", str(dest), requirement]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)
    return sorted(dest.glob(f"{name}-*-cp312-*.whl"))[-1]


def repack_xz(wheel: Path, out: Path) -> Path:
    """The wheel's files as one xz tar (unpacked into a --target folder on the device, as pip would):
    xz finds what deflate misses in the CUDA library's kernels."""
    if out.exists():
        return out
    work = out.parent / ".unzip"
    shutil.rmtree(work, ignore_errors=True)
    shutil.unpack_archive(wheel, work, "zip")
    tmp = out.with_suffix(".part")
    with open(tmp, "wb") as f:
        tar = subprocess.Popen(["tar", "-C", str(work), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-9", "-c"], stdin=tar.stdout, stdout=f, check=True)
        if tar.wait():
            raise RuntimeError(f"tar of {work} failed")
    tmp.rename(out)
    shutil.rmtree(work)
    return out


def split(path: Path, piece_bytes: int, dest: Path) -> list[Path]:
    """path cut into pieces of at most piece_bytes: NAME.00, NAME.01, ... (cat joins them)."""
    out = []
    with open(path, "rb") as f:
        while chunk := f.read(piece_bytes):
            p = dest / f"{path.name}.{len(out):02d}"
            p.write_bytes(chunk)
            out.append(p)
    return out


def sha256(path: Path) -> str:
    """The file's sha256 (hashlib.file_digest: Python 3.11 here, the device's 3.12)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def plan_calls(pieces: list[Piece], room: int) -> list[list[Piece]]:
    """Pieces into calls in order (a file's pieces stay in sequence), each call's at most `room`
    bytes and MAX_CARRY - 1 paths (PIECES rides in every call)."""
    calls: list[list[Piece]] = [[]]
    for p in pieces:
        if p.nbytes > room:
            raise ValueError(f"{p.name} is {p.nbytes} bytes, more than one call's room ({room})")
        if sum(x.nbytes for x in calls[-1]) + p.nbytes > room or len(calls[-1]) == MAX_CARRY - 1:
            calls.append([])
        calls[-1].append(p)
    return calls


def build_wheel(dest: Path) -> Path:
    """edgespec's own wheel, built from this tree (installed on the device with --no-deps)."""
    for old in dest.glob("edgespec-*.whl"):
        old.unlink()
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(ROOT)]
    had_build = (ROOT / "build").exists()
    subprocess.run(cmd, check=True)
    if not had_build:  # setuptools' scratch folder, made by this build
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    return next(dest.glob("edgespec-*.whl"))


def pack(default_model: bool) -> list[list[Piece]]:
    """.devpack/send: the pieces and PIECES; .devpack/calls.json: the carry list of each call."""
    engines = export_engines(PACK / "engines", default_model)
    send = PACK / "send"
    shutil.rmtree(send, ignore_errors=True)
    send.mkdir(parents=True)
    tree = travelling_bytes()
    room = min(MAX_PIECE, CALL_LIMIT - tree - MARGIN)
    if room < 8 * 2**20:
        raise SystemExit(f"the working tree is {tree / 2**20:.1f} MiB: under 8 MiB of a call's 64 are left")
    files = [repack_xz(download_ort(PACK / "wheels"), PACK / "wheels" / "onnxruntime-gpu.tar.xz")]
    files.append(build_wheel(PACK / "wheels"))
    tar = PACK / "wheels" / "engines.tar"  # no compression: fp32/fp16 weights barely shrink
    with tarfile.open(tar, "w") as t:
        for role, folder in engines.items():
            if role != "default":
                t.add(folder, arcname=role)
        t.add(PACK / "engines" / HF_FOLDER, arcname=HF_FOLDER)
    files.append(tar)
    if "default" in engines:  # 228 MB (an fp32 embedding table), 138 MB as xz: 5 more calls
        files.append(PACK / "wheels" / "default.tar.xz")
        with tarfile.open(files[-1], "w:xz", preset=6) as t:
            t.add(engines["default"], arcname="default")
    paths = []
    for f in files:
        if f.stat().st_size > room:
            paths += split(f, room, send)
        else:
            paths.append(Path(shutil.copy(f, send / f.name)))
    pieces = [Piece(p.name, p.stat().st_size, sha256(p)) for p in paths]
    (send / "PIECES").write_text("".join(f"{p.sha256}  {p.name}\n" for p in pieces))
    calls = plan_calls(pieces, room)
    plan = {
        "tree_mib": round(tree / 2**20, 2),
        "room_per_call_mib": round(room / 2**20, 2),
        "calls": [[f".devpack/send/{p.name}" for p in c] + [".devpack/send/PIECES"] for c in calls],
    }
    (PACK / "calls.json").write_text(json.dumps(plan, indent=1))
    return calls


def collect(send: Path, store: Path, site: Path) -> bool:
    """On the device, every call: keep the pieces this call carried (send/) in store, which outlives
    the call on a warm machine; once PIECES's every piece is there and checks, join and unpack them
    (once): the xz tar and wheels into site (a --target folder for PYTHONPATH), the engine tars into
    store/engines. True when all is unpacked; False (and what is missing) while pieces are to come."""
    store.mkdir(parents=True, exist_ok=True)
    for f in sorted(send.iterdir()) if send.is_dir() else ():
        if f.name == "PIECES" or not (store / f.name).exists():
            shutil.copy(f, store / f.name)
    if not (store / "PIECES").exists():
        raise SystemExit(f"no PIECES in {send} or {store}. Hint: python tools/device_pack.py here, then its calls")
    listed = [line.split() for line in (store / "PIECES").read_text().splitlines() if line.strip()]
    missing = [name for _, name in listed if not (store / name).exists()]
    if missing:
        print(f"device_pack: {len(listed) - len(missing)} of {len(listed)} pieces here; to come: {' '.join(missing)}")
        return False
    done = site / ".unpacked"  # the PIECES it was unpacked from
    if done.exists() and done.read_text() == (store / "PIECES").read_text():
        return True
    bad = [name for digest, name in listed if sha256(store / name) != digest]
    if bad:
        for name in bad:
            (store / name).unlink()
        raise SystemExit(f"pieces {' '.join(bad)} differ from PIECES (dropped). Hint: carry them again")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    files: dict[str, list[Path]] = {}  # joined name -> its pieces in order
    for _, name in listed:
        m = re.fullmatch(r"(.+)\.(\d\d)", name)
        files.setdefault(m.group(1) if m else name, []).append(store / name)
    for name, parts in files.items():
        joined = store / ("." + name)
        with open(joined, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out)
        if name.startswith(("engines.", "default.")):  # engine folders
            with tarfile.open(joined) as t:
                t.extractall(store / "engines", filter="data")
        elif name.endswith(".tar.xz"):  # a wheel's files, as pip --target would lay them out
            with tarfile.open(joined, "r:xz") as t:
                t.extractall(site, filter="data")
        elif name.endswith(".whl"):
            with zipfile.ZipFile(joined) as z:
                z.extractall(site)
        joined.unlink()
    link_nvidia(site)
    done.write_text((store / "PIECES").read_text())
    return True


def link_nvidia(site: Path) -> None:
    """site/nvidia -> the nvidia-* CUDA wheels' folder of this Python (the lent machine's torch brings
    them): onnxruntime.preload_dlls() looks for them beside the onnxruntime package it is in."""
    for entry in sys.path:
        found = Path(entry or ".") / "nvidia"
        if found.is_dir() and Path(entry).resolve() != site.resolve() and not (site / "nvidia").exists():
            (site / "nvidia").symlink_to(found.resolve())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines-only", action="store_true", help="only export .devpack/engines")
    ap.add_argument("--default-model", action="store_true", help="also send the default model's int4 folder")
    ap.add_argument(
        "--collect",
        nargs=3,
        metavar=("SEND", "STORE", "SITE"),
        help="on the device: keep this call's pieces, unpack when complete (exit 3: pieces to come)",
    )
    a = ap.parse_args()
    if a.collect:
        sys.exit(0 if collect(*map(Path, a.collect)) else 3)
    if a.engines_only:
        for role, folder in export_engines(PACK / "engines", a.default_model).items():
            print(f"{role}: {folder}")
        return
    calls = pack(a.default_model)
    plan = json.loads((PACK / "calls.json").read_text())
    total = sum(p.nbytes for c in calls for p in c)
    print(
        f"{total / 2**20:.1f} MiB in {sum(len(c) for c in calls)} pieces, {len(calls)} calls "
        f"(tree {plan['tree_mib']} MiB, {plan['room_per_call_mib']} MiB of pieces per call). Send them back to "
        "back (the machine goes back 30 s after a call), each with the same command:"
    )
    for i, carry in enumerate(plan["calls"], 1):
        print(f'  {i}. run(command="bash tools/device_check.sh", timeout_s=600, carry={json.dumps(carry)})')


if __name__ == "__main__":
    main()
