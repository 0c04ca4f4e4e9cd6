"""The prepared GPU check rehearsed on the CPU: tools/device_check.sh --dry-run runs every stage on
tiny folders, the report survives a failing stage, and the pieces that carry onnxruntime-gpu to the
lent machine are collected across calls and unpacked only when all are there and check."""

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import device_check  # noqa: E402
import device_pack  # noqa: E402


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    pytest.importorskip("torch")
    return device_pack.export_engines(tmp_path_factory.mktemp("devpack") / "engines")


def test_dry_run_runs_every_stage(engines, tmp_path):
    """bash tools/device_check.sh --dry-run: every stage without an error, on the folders it lists."""
    root = engines["ref"].parent
    env = os.environ | {"PYTHON": sys.executable, "ENGINES": str(root), "OUT": str(tmp_path)}
    args = ["--limit", "2", "--max-new-tokens", "16", "--calls", "3"]
    r = subprocess.run(
        ["bash", str(ROOT / "tools/device_check.sh"), "--dry-run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert r.returncode == 0 and report["errors"] == {}, (r.stdout[-2000:], r.stderr[-3000:], report.get("errors"))
    ran = {k.rsplit("_cpu", 1)[0] for k in report if isinstance(report[k], dict) and "seconds" in report[k]}
    assert ran == set(device_check.STAGES), ran
    assert set(report["environment"]["folders"]) == {"ref", "fp16", "int4"}
    bench = report["bench_cpu"]
    assert set(bench["ref"]["summary"]) == {"none", "ngram", "draft", "eagle"}
    for role in ("ref", "fp16"):
        for drafter, row in bench[role]["summary"].items():
            assert row["identical_to_none"] == "2/2", (role, drafter, row)
    assert all(r["argmax_agree"] == 1.0 for r in report["parity_cpu"]["ref"].values())
    for role in ("ref", "int4"):  # the --host-prologue folders: capture code on host memory, same bits
        cg = report["cuda_graph"][role]
        assert cg["on"]["captured"] and not cg["off"]["captured"], cg
        assert cg["ngram_output_identical"] and cg["max_abs_diff_on_vs_off"] == {"t1": 0.0, "t5": 0.0}
        on, off = cg["on"], cg["off"]
        assert on["captured_at_load"] > 0 and off["captured_at_load"] == 0
        assert on["device_bytes_after_close"] == off["device_bytes_after_close"] == 0
        greedy, full = on["verify5_traffic"]["greedy"], on["verify5_traffic"]["with_logits"]
        assert greedy["d2h_bytes"] == 5 * 8 * 8 and greedy["h2d_calls"] == 1  # the ids, not 5 x V floats
        assert full["d2h_bytes"] == greedy["d2h_bytes"] + 5 * 256 * 4  # (the tiny vocabulary: 256)
    assert set(report["width_table_cpu"]["ref"]["ms_p50"]) == {"1", "2", "3", "5", "9", "16"}
    assert report["transformers"]["identical_to_edgespec_none"] == "2/2"


def test_report_keeps_earlier_stages_when_a_later_one_fails(tmp_path):
    cfg = device_check.CheckConfig(engines=str(tmp_path), out=str(tmp_path / "r.json"))
    report = device_check.Report(cfg.out, cfg)
    with report.stage("first") as entry:
        entry["ms"] = 1.5
    with report.stage("second"):
        on_disk = json.loads((tmp_path / "r.json").read_text())
        assert on_disk["first"]["ms"] == 1.5  # written when the first stage ended, before the second
        raise RuntimeError("CUDA error 700")
    with report.stage("third") as entry:
        entry["ran"] = True
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["first"]["ms"] == 1.5 and data["third"]["ran"]
    assert report.errors() == {"second": "RuntimeError: CUDA error 700"}


def _fake_pack(tmp_path: Path, room: int):
    """A pack as device_pack.pack lays it out, small: a package as an xz tar, a wheel, an engines tar."""
    src = tmp_path / "files"
    src.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        data = os.urandom(5000)  # incompressible: the tar is cut into several pieces
        info = tarfile.TarInfo("fakeort/capi/lib.so")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    (src / "onnxruntime-gpu.tar.xz").write_bytes(buf.getvalue())
    with zipfile.ZipFile(src / "edgespec-0.1.0-py3-none-any.whl", "w") as z:
        z.writestr("edgespec/__init__.py", "__version__ = 'fake'\n")
    with tarfile.open(src / "engines.tar", "w") as t:
        info = tarfile.TarInfo("ref/manifest.json")
        info.size = 2
        t.addfile(info, io.BytesIO(b"{}"))
    send = tmp_path / "send"
    send.mkdir()
    paths = []
    for f in sorted(src.iterdir()):
        paths += device_pack.split(f, room, send)
    pieces = [device_pack.Piece(p.name, p.stat().st_size, device_pack.sha256(p)) for p in paths]
    (send / "PIECES").write_text("".join(f"{p.sha256}  {p.name}\n" for p in pieces))
    return send, device_pack.plan_calls(pieces, room)


def test_pieces_collected_across_calls_then_unpacked(tmp_path):
    send, calls = _fake_pack(tmp_path, room=2048)
    assert len(calls) >= 3 and all(sum(p.nbytes for p in c) <= 2048 for c in calls)
    store, site = tmp_path / "store", tmp_path / "site"
    for i, call in enumerate(calls):  # each call's tree holds only what that call carried
        carried = tmp_path / f"call{i}"
        carried.mkdir()
        for p in call:
            (carried / p.name).write_bytes((send / p.name).read_bytes())
        (carried / "PIECES").write_bytes((send / "PIECES").read_bytes())
        ready = device_pack.collect(carried, store, site)
        assert ready == (i == len(calls) - 1)
    assert (site / "fakeort/capi/lib.so").stat().st_size == 5000
    assert (site / "edgespec/__init__.py").exists() and (store / "engines/ref/manifest.json").exists()
    assert device_pack.collect(tmp_path / "none", store, site)  # a later call finds it unpacked


def test_a_corrupt_piece_is_dropped_and_named(tmp_path):
    send, calls = _fake_pack(tmp_path, room=2048)
    store, site = tmp_path / "store", tmp_path / "site"
    bad = calls[0][0].name
    (send / bad).write_bytes(b"x" + (send / bad).read_bytes()[1:])
    with pytest.raises(SystemExit, match=bad):
        device_pack.collect(send, store, site)
    assert not (store / bad).exists() and not site.exists()


def test_calls_carry_at_most_eight_paths():
    pieces = [device_pack.Piece(f"p{i}", 10, "0") for i in range(20)]
    calls = device_pack.plan_calls(pieces, room=1000)
    assert [len(c) for c in calls] == [7, 7, 6]  # + PIECES each
    with pytest.raises(ValueError, match="more than one call's room"):
        device_pack.plan_calls([device_pack.Piece("big", 2000, "0")], room=1000)
