"""Weights loaded once: a weights file is mapped once per process, the pages a session read to prepack
leave the resident set (they stay in the page cache), outputs do not change; load time is reported."""

import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.engines import session as es

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def resident(path: Path) -> int:
    """Bytes of this process's mapping of a weights file (es.map_weights) resident (/proc/self/smaps;
    the mapping by its address: an export in this process may map the same file under another name)."""
    start = es.map_weights(path).ctypes.data
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= start < hi
        elif inside and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


@linux
def test_dropped_pages_leave_the_resident_set_and_read_back_the_same(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, np.uint8)
    path = tmp_path / "w.weights"
    data.tofile(path)
    mapped = es.map_weights(path)
    assert mapped is es.map_weights(path) and not mapped.flags.writeable  # one read-only mapping
    assert int(mapped.sum(dtype=np.int64)) == int(data.sum(dtype=np.int64))  # every page read
    assert resident(path) >= data.nbytes // 2
    es.drop_mapped_pages(path)
    assert resident(path) == 0
    np.testing.assert_array_equal(mapped, data)  # faulted back from the file, unchanged
    with es.PageDropper([path], every=0.01):  # the session-making form: drops at its end too
        mapped[:4096].sum()
    assert resident(path) == 0


@linux
def test_a_session_keeps_no_weights_pages_it_read_to_prepack_and_outputs_are_unchanged(tiny_engine, monkeypatch):
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    def greedy(folder):
        with Generator.load(folder, RuntimeConfig(drafter="none")) as g:
            tgt = g.target
            files = es.weights_files(g.manifest, tgt.spec)
            out = list(g.generate_ids(np.array([1, 2, 3], np.int64), 8))
            load = g.footprint()
            assert load["load_s"] == g.load_s > 0
            assert load["weights_bytes"] >= sum(f.stat().st_size for f in files)  # every file mapped, once
            assert load["kv_bytes"] >= tgt.kv.nbytes  # (and the draft model's, loaded too)
            return np.concatenate(out), files

    dropped, files = greedy(tiny_engine)
    tgt_file = files[0]
    es.drop_mapped_pages(tgt_file)
    manifest = load_manifest(tiny_engine)
    model = OrtModel(manifest, manifest.target)
    model.session()  # made (prepacked), not run yet: none of the file's pages are resident
    assert resident(tgt_file) == 0
    model.close()
    monkeypatch.setattr(es, "drop_mapped_pages", lambda path: None)  # as before: the read pages stay
    kept, _ = greedy(tiny_engine)
    np.testing.assert_array_equal(dropped, kept)


def test_generate_prints_and_records_the_load(tiny_engine, tmp_path, capsys):
    import json

    from edgespec.cli import main

    out = tmp_path / "gen.json"
    args = ["generate", "--engine", str(tiny_engine), "--prompt", "hi", "--max-new-tokens", "4", "--json", str(out)]
    assert main(args) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgespec: loaded in ")]
    load = json.loads(out.read_text())["load"]
    assert len(said) == 1 and f"{load['load_s']:.1f} s" in said[0] and "GB mapped" in said[0]
    assert load["load_s"] > 0 and load["weights_bytes"] > 0 and load["kv_bytes"] > 0
