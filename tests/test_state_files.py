"""Drafter state files (issue 56, part A): the recycle table and the suffix cache are written whole (a
temporary file renamed over the old one), and a damaged, foreign or hostile file is one warning naming
it, set aside as NAME.bad, and a cold start: generation goes on, identical to plain decoding."""

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters.recycle import RecycleConfig, RecycleTable
from edgespec.runtime.drafters.suffix import SuffixCache, SuffixConfig
from edgespec.runtime.generator import Generator

V = 64
PROMPT = [3, 17, 5, 3, 17, 9, 22, 3, 17, 5, 41, 8, 3]


def _gen(drafter: str, cache: Path | None) -> Generator:
    target = FakeModel(random_table(V, seed=0), max_len=512)
    cfg = RuntimeConfig(drafter=drafter, k=4, suffix_cache=str(cache) if cache else None)
    return Generator(None, Engines(target), cfg)


def _run(g: Generator, n: int = 40) -> list[int]:
    return [int(t) for c in g.generate_ids(np.array(PROMPT, np.int64), n) for t in c]


PLAIN = None


def _plain() -> list[int]:
    global PLAIN
    if PLAIN is None:
        PLAIN = _run(_gen("none", None))
    return PLAIN


def _one_warning(make) -> tuple[object, str]:
    """(what make() returns, its one RuntimeWarning's message); a second warning or none fails."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = make()
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1, said
    assert "\n" not in said[0]
    return out, said[0]


# ---- the recycle table -----------------------------------------------------------------------------------


def _saved_table(tmp_path: Path) -> tuple[Path, Path]:
    """(the suffix cache path, the recycle table saved beside it) after one request."""
    cache = tmp_path / "cache.npy"
    g = _gen("recycle", cache)
    assert _run(g) == _plain()
    g.drafter.recycle_table.save()
    table = tmp_path / "cache.recycle.npz"
    assert table.exists() and (g.drafter.recycle_table.keys >= 0).sum() > 10
    return cache, table


def _rewrite(table: Path, **changes) -> None:
    with np.load(table) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(table, **(arrays | changes))


def _damage(kind: str, table: Path) -> None:
    if kind == "truncated":
        table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    elif kind == "garbage":
        table.write_bytes(os.urandom(4096))
    elif kind == "ids_past_vocab":
        with np.load(table) as z:
            ids = z["ids"].copy()
        ids[5, 0] = V + 7
        _rewrite(table, ids=ids)
    elif kind == "negative_ids":
        with np.load(table) as z:
            ids = z["ids"].copy()
        ids[3, 2] = -9
        _rewrite(table, ids=ids)
    elif kind == "wrong_shape":
        with np.load(table) as z:
            keys = z["keys"][:-10]
        _rewrite(table, keys=keys)
    elif kind == "nan_probs":
        with np.load(table) as z:
            probs = z["probs"].copy()
        probs[7, 0] = np.nan
        _rewrite(table, probs=probs)
    elif kind == "key_in_wrong_slot":
        with np.load(table) as z:
            keys = z["keys"].copy()
        used = np.flatnonzero(keys[V:-1] >= 0) + V
        keys[used[0]], keys[used[0] + 1] = -1, keys[used[0]]  # moved one slot on
        _rewrite(table, keys=keys)
    elif kind == "missing_array":
        with np.load(table) as z:
            arrays = {k: z[k] for k in z.files if k != "probs"}
        np.savez(table, **arrays)
    elif kind == "pickled":
        np.savez(table, keys=np.array([{"a": 1}], dtype=object), ids=0, probs=0, vocab=V, bits=16)
    elif kind == "fifo":
        table.unlink()
        os.mkfifo(table)
    elif kind == "folder":
        table.unlink()
        table.mkdir()


RECYCLE_DAMAGE = [
    "truncated",
    "garbage",
    "ids_past_vocab",
    "negative_ids",
    "wrong_shape",
    "nan_probs",
    "key_in_wrong_slot",
    "missing_array",
    "pickled",
    "fifo",
    "folder",
]


@pytest.mark.parametrize("kind", RECYCLE_DAMAGE)
def test_a_damaged_recycle_table_is_set_aside_and_the_drafter_starts_cold(tmp_path, kind):
    cache, table = _saved_table(tmp_path)
    _damage(kind, table)
    g, said = _one_warning(lambda: _gen("recycle", cache))
    assert str(table) in said and "damaged recycle table" in said and "starts cold" in said, said
    assert "set aside as cache.recycle.npz.bad" in said
    assert not table.exists() and (tmp_path / "cache.recycle.npz.bad").exists()
    assert (g.drafter.recycle_table.keys == -1).all()  # cold: empty
    assert _run(g) == _plain()  # and it drafts, lossless, from what it fills
    g.drafter.recycle_table.save()  # the next save writes a good table at the name
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert (_gen("recycle", cache).drafter.recycle_table.keys >= 0).sum() > 10


def test_merged_with_a_damaged_table_is_one_warning_and_lossless(tmp_path):
    cache, table = _saved_table(tmp_path)
    _damage("ids_past_vocab", table)
    g, said = _one_warning(lambda: _gen("merged", cache))
    assert "ids from" in said and f"outside -1 .. {V - 1}" in said
    assert _run(g) == _plain()


def test_a_table_of_other_settings_is_skipped_not_set_aside(tmp_path):
    _, table = _saved_table(tmp_path)
    t, said = _one_warning(lambda: RecycleTable(V, RecycleConfig(bits=8), start=table))
    assert "another vocabulary or size" in said and table.exists() and (t.keys == -1).all()


def test_a_damaged_warm_start_file_is_ignored_not_moved(tmp_path):
    """A folder's `edgespec warm` table is read, never written: damaged, it is only ignored."""
    _, table = _saved_table(tmp_path)
    start = tmp_path / "recycle.npz"
    table.rename(start)
    _damage("ids_past_vocab", start)
    t, said = _one_warning(lambda: RecycleTable(V, RecycleConfig(), start=start))
    assert "ignored" in said and start.exists() and (t.keys == -1).all()


def test_recycle_save_is_atomic(tmp_path, monkeypatch):
    cache, table = _saved_table(tmp_path)
    good = table.read_bytes()
    g = _gen("recycle", cache)
    _run(g, 60)

    def half_then_fail(f, **arrays):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        g.drafter.recycle_table.save()
    assert table.read_bytes() == good  # the old table, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.recycle.npz"]  # no temporary left
    table.unlink()
    with pytest.raises(OSError):
        g.drafter.recycle_table.save()
    assert not table.exists()  # nothing at the final name rather than half a file


# ---- the suffix cache ------------------------------------------------------------------------------------


def _saved_cache(tmp_path: Path) -> Path:
    path = tmp_path / "cache.npy"
    c = SuffixCache(SuffixConfig(file=str(path)), vocab_size=V)
    c.add(np.array(PROMPT * 3))
    c.add(np.array(PROMPT[::-1] * 2))
    c.save()
    assert path.exists()
    return path


def _damage_cache(kind: str, path: Path) -> None:
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:150])
    elif kind == "header_only":
        path.write_bytes(path.read_bytes()[:20])
    elif kind == "garbage":
        path.write_bytes(os.urandom(512))
    elif kind == "ids_past_vocab":
        np.save(path, np.array([1, 2, V, -1], np.int32))
    elif kind == "below_sep":
        np.save(path, np.array([1, 2, -5, -1], np.int32))
    elif kind == "two_d":
        np.save(path, np.ones((3, 4), np.int32))
    elif kind == "floats":
        np.save(path, np.ones(8, np.float32))
    elif kind == "pickled":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)


SUFFIX_DAMAGE = ["truncated", "header_only", "garbage", "ids_past_vocab", "below_sep", "two_d", "floats", "pickled"]


@pytest.mark.parametrize("kind", [*SUFFIX_DAMAGE, "fifo"])
def test_a_damaged_suffix_cache_is_set_aside_and_the_drafter_starts_cold(tmp_path, kind):
    path = _saved_cache(tmp_path)
    _damage_cache(kind, path)
    g, said = _one_warning(lambda: _gen("suffix", path))
    assert str(path) in said and "damaged suffix cache" in said and "starts cold" in said, said
    assert not path.exists() and (tmp_path / "cache.npy.bad").exists()
    assert _run(g) == _plain()


def test_the_suffix_cache_loads_whole_and_its_tail_only(tmp_path):
    path = _saved_cache(tmp_path)
    full = SuffixCache(SuffixConfig(file=str(path)), vocab_size=V)
    tail = SuffixCache(SuffixConfig(file=str(path), max_tokens=10), vocab_size=V)
    assert len(full) == 3 * len(PROMPT) + 2 * len(PROMPT) + 2 and tail.tokens.tolist() == full.tokens[-10:].tolist()


def test_suffix_save_is_atomic_and_writes_the_named_file(tmp_path, monkeypatch):
    path = _saved_cache(tmp_path)
    good = path.read_bytes()
    c = SuffixCache(SuffixConfig(file=str(path)), vocab_size=V)
    c.add(np.array(PROMPT))

    def half_then_fail(f, arr, **_):
        f.write(b"\x93NUMPY half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        c.save()
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["cache.npy"]
    monkeypatch.undo()
    other = tmp_path / "recent.cache"  # any name: written as given (np.save would add .npy to a path)
    SuffixCache(SuffixConfig(file=str(other)), vocab_size=V).save()
    assert other.exists() and not (tmp_path / "recent.cache.npy").exists()
