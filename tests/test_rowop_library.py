"""The row kernel's library file (engines/rowop: build, damage): loaded only when its size and sha256
are the ones its build recorded beside it. A truncated, empty, altered or unrecorded library at the
keyed build path is rebuilt once, or refused in one line naming the file and the setup command;
never mapped (a truncated one killed the process with SIGBUS). The loads run in a subprocess, with a
stub library standing in for the real build (compiled once, in well under a second)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.engines import rowop
from edgespec.engines.rowop import build as rowop_build

STUB = """
extern "C" {
const char* edgespec_rowop_path(const char** why) { return "portable"; }
int edgespec_rowop_runs(const char*) { return 1; }
int edgespec_rowop_matmul(const char*, const void*, const void*, long long, const void*, void*) { return 1; }
int edgespec_rowop_gather(const void*, const void*, long long, const void*, void*) { return 1; }
int edgespec_stub_pad[1 << 14] = {1};  // 64 KiB of data: a truncated copy cuts into mapped pages
}
"""

# Loads the library the way every caller does (rowop.unavailable, then register where refused),
# with the compile step replaced: "builds" copies the stub in, "fails" fails, "killed" is killed mid-way.
DRIVER = r"""
import json, os, shutil, signal, sys
from pathlib import Path
from edgespec.engines import rowop
from edgespec.engines.rowop import build
stub, mode = sys.argv[1], sys.argv[2]
builds = []
def fake_compile(cxx, include, folder, verbose):
    builds.append(1)
    if mode == "fails":
        raise rowop.RowopUnavailable("the build failed: g++ -O2 ...: fatal error: no space left on device")
    lib = folder / rowop.LIBRARY
    if mode == "killed":
        lib.write_bytes(Path(stub).read_bytes()[:1000])
        os.kill(os.getpid(), signal.SIGKILL)
    return Path(shutil.copy(stub, lib))
build._compile = fake_compile
why, reg = rowop.unavailable(), ""
if why:
    try:
        rowop.register(None)
    except rowop.RowopUnavailable as e:
        reg = str(e)
print(json.dumps({"why": why, "builds": len(builds), "register": reg}))
"""


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    cxx = rowop.find_compiler()
    if cxx is None:
        pytest.skip("no C++ compiler for the stub library")
    d = tmp_path_factory.mktemp("stub")
    (d / "stub.cc").write_text(STUB)
    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(d / "stub.so"), str(d / "stub.cc")], check=True)
    (d / "driver.py").write_text(DRIVER)
    return d


@pytest.fixture
def keyed(tmp_path, monkeypatch, stub):
    """The keyed library path in a build folder of this test's own (a stand-in header), built whole."""
    include = tmp_path / "include"
    include.mkdir()
    (include / rowop.HEADER).write_text("/* ONNX Runtime's C API, as far as the key is concerned */\n")
    monkeypatch.setenv("EDGESPEC_ROWOP_BUILD", str(tmp_path / "build"))
    monkeypatch.setenv("EDGESPEC_ORT_INCLUDE", str(include))
    monkeypatch.setattr(
        rowop_build, "_compile", lambda cxx, inc, folder, v: Path(shutil.copy(stub / "stub.so", folder))
    )
    cxx = rowop.find_compiler()
    lib = rowop.library_file(cxx, include)
    rowop_build._install(cxx, include, lib, False)
    assert rowop.damage(lib) == "" and json.loads(rowop.record_file(lib).read_text())["size"] == lib.stat().st_size
    return lib


def _load(stub, mode):
    r = subprocess.run(
        [sys.executable, str(stub / "driver.py"), str(stub / "stub.so"), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r


def _truncate(lib):
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])


def _flip(lib):
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))


DAMAGE = {
    "truncated": _truncate,
    "empty": lambda lib: lib.write_bytes(b""),
    "bad checksum": _flip,
    "no record": lambda lib: rowop.record_file(lib).unlink(),
    "bad record": lambda lib: rowop.record_file(lib).write_text("{"),
}


def test_a_whole_library_loads_without_a_rebuild(keyed, stub):
    r = _load(stub, "builds")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"why": "", "builds": 0, "register": ""} and "warning" not in r.stderr


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_library_is_rebuilt_once(keyed, stub, kind):
    DAMAGE[kind](keyed)
    assert rowop.damage(keyed)
    r = _load(stub, "builds")
    assert r.returncode == 0, (r.returncode, r.stderr)  # never SIGBUS (-7) nor a traceback
    assert json.loads(r.stdout) == {"why": "", "builds": 1, "register": ""}
    assert f"warning: the row kernel's library {keyed}" in r.stderr and "rebuilding it" in r.stderr
    assert rowop.damage(keyed) == ""


@pytest.mark.parametrize("kind", ["truncated", "empty", "bad checksum"])
def test_a_damaged_library_that_cannot_be_rebuilt_is_refused_in_one_line(keyed, stub, kind):
    DAMAGE[kind](keyed)
    r = _load(stub, "fails")
    assert r.returncode == 0, (r.returncode, r.stderr)
    out = json.loads(r.stdout)
    assert out["builds"] == 1
    for msg in (out["why"], out["register"]):  # register: what loading a rowop folder says
        assert "\n" not in msg and str(keyed) in msg and rowop.SETUP in msg, msg
    assert "no space left" in out["why"] and "--int4-kernel nbits" in out["register"]
    assert "Traceback" not in r.stderr


def test_a_kill_mid_build_leaves_nothing_at_the_keyed_path(keyed, stub):
    keyed.unlink()
    rowop.record_file(keyed).unlink()
    r = _load(stub, "killed")
    assert r.returncode == -9
    assert not keyed.exists() and not rowop.record_file(keyed).exists()


def test_the_export_falls_back_to_matmulnbits_with_a_warning(monkeypatch, tmp_path, capsys):
    from edgespec.export.target.checks import probe
    from edgespec.export.target.exporter import ExportConfig
    from edgespec.export.target.spec import ExportError

    lib = tmp_path / "librowop.so"
    why = f"the row kernel's library {lib} is empty, its build wrote 1,000 (truncated or replaced), ..."
    monkeypatch.setattr(rowop_build, "_LIB", {"why": why, "damaged": lib})
    cands, why_not = probe.candidates(ExportConfig(target="x", out=str(tmp_path / "e"), precision="auto"))
    assert probe.ROWOP not in cands and set(cands) == {"int4", "int8"} and why_not == why
    err = capsys.readouterr().err
    assert f"warning: {why}; the int4 linears use MatMulNBits instead" in err and err.count("\n") == 1
    # asked for by name, the row kernel is refused in one line naming the file, before any work
    with pytest.raises(ExportError, match="is empty") as e:
        ExportConfig(target="x", out=str(tmp_path / "e"), precision="int4", int4_kernel="rowop").check()
    assert str(lib) in str(e.value) and "\n" not in str(e.value)
    assert not os.listdir(tmp_path)
