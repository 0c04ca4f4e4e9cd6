"""The context and KV cache type chosen at load (engines/context.py): `--max-len` up to the folder's
maximum allocates the caches for that context only and changes no token of a generation that fits;
`--kv-dtype` fp16 where the graphs read a half cache (the row kernel's attention), fp32 otherwise;
each refusal is one line naming the limit and the figure, before any allocation."""

import numpy as np
import pytest
from helpers.cli import one_line_error, run_cli

from edgespec.engines.context import ContextError, at_load, kv_bytes_per_token, minimum_context
from edgespec.engines.manifest import load_manifest
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator

PROMPT = np.array([5, 9, 5, 9, 12, 30, 5, 9, 5, 9, 12, 41, 7, 5, 9, 5, 9, 12], np.int64)


@pytest.fixture(autouse=True)
def _own_pools(monkeypatch):
    """main() shares one thread pool per process; these tests run it beside other sessions."""
    import edgespec.engines.ort as eo

    monkeypatch.setattr(eo, "share_thread_pool", lambda threads=None: 0)


def _ids(g, n=24):
    return [int(t) for c in g.generate_ids(PROMPT, n) for t in c]


def test_a_smaller_context_allocates_only_it_and_changes_no_token(tiny_engine):
    full = Generator.load(tiny_engine, RuntimeConfig(drafter="draft", k=4))
    small = Generator.load(tiny_engine, RuntimeConfig(drafter="draft", k=4, max_len=70))
    m = load_manifest(tiny_engine)
    assert m.max_len == 256 and full.target.max_len == 256
    assert small.target.max_len == 96  # rounded up to kv_bucket 32
    assert small.target.kv.shape[2] == 96 and full.target.kv.shape[2] == 256
    draft = small.engines.get("draft")
    assert draft.max_len == 96 and draft.kv.shape[2] == 96  # every cache of the folder
    assert _ids(small) == _ids(full)
    # the loop stops at the chosen context (prompt 18 + 78 tokens = 96)
    assert len(_ids(small, 200)) == 96 - len(PROMPT)


def test_the_folders_maximum_and_the_minimum_are_the_limits(tiny_engine, monkeypatch):
    m = load_manifest(tiny_engine)
    assert at_load(m, 256).max_len == 256 and at_load(m).max_len == 256
    assert minimum_context(m) == 32  # the prefill chunk 16, k + 2 = 10, in 32-token buckets
    assert at_load(m, 32).max_len == 32

    def no_allocation(*a, **k):
        raise AssertionError("engines made before the refusal")

    monkeypatch.setattr("edgespec.runtime.generator.make_engines", no_allocation)
    with pytest.raises(ContextError, match=r"--max-len 4096 is above .*maximum context of 256 tokens.*--max-len 256"):
        Generator.load(tiny_engine, RuntimeConfig(max_len=4096))
    with pytest.raises(ContextError, match=r"--max-len 8 is below the 32 tokens"):
        Generator.load(tiny_engine, RuntimeConfig(max_len=8))
    with pytest.raises(ValueError, match="--max-len 0"):
        Generator.load(tiny_engine, RuntimeConfig(max_len=0))


def test_an_fp32_only_folder_loads_fp32_and_refuses_fp16(tiny_engine, monkeypatch):
    """A folder whose graphs read an fp32 cache only (the ONNX attention, or one exported before half
    caches): fp32 by default; --kv-dtype fp16 refused in one line, before anything is allocated."""
    g = Generator.load(tiny_engine, RuntimeConfig(drafter="none"))
    assert g.manifest.kv_cache_dtype == "float32" and g.target.kv.dtype == np.float32
    monkeypatch.setattr("edgespec.runtime.generator.make_engines", lambda *a: pytest.fail("allocated"))
    with pytest.raises(ContextError, match=r"--kv-dtype fp16: .* read only fp32 KV caches.*--kv-dtype fp32"):
        Generator.load(tiny_engine, RuntimeConfig(kv_dtype="fp16"))


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--max-len", "9999"], "--max-len 9999 is above"),
        (["--max-len", "4"], "--max-len 4 is below the 32 tokens"),
        (["--kv-dtype", "fp16"], "--kv-dtype fp16:"),
    ],
)
def test_cli_refuses_in_one_line_with_exit_2(tiny_engine, capsys, flags, says):
    rc, err = run_cli(capsys, "generate", "--engine", tiny_engine, "--prompt", "hi", *flags)
    assert rc == 2 and says in one_line_error(err, "generate")


def test_the_runtime_commands_take_the_flags():
    from edgespec.cli import build_parser

    p = build_parser()
    for cmd in (["generate", "--prompt", "x"], ["bench"], ["chat"], ["serve"]):
        a = p.parse_args(cmd + ["--max-len", "512", "--kv-dtype", "fp32"])
        cfg = RuntimeConfig.from_args(a)
        assert (cfg.max_len, cfg.kv_dtype) == (512, "fp32"), cmd
    with pytest.raises(SystemExit):
        p.parse_args(["generate", "--prompt", "x", "--kv-dtype", "int8"])


@pytest.fixture(scope="module")
def rowop_engine(tiny_models, tmp_path_factory):
    """A tiny llama exported with the row kernel (its attention reads a half cache) and a self:1 draft."""
    from tiny import TINY_EXPORT

    from edgespec.engines import rowop
    from edgespec.export.target.exporter import ExportConfig, export

    if rowop.unavailable():
        pytest.skip(f"row kernel not available: {rowop.unavailable()}")
    out = tmp_path_factory.mktemp("rowop_kv") / "tiny"
    opts = TINY_EXPORT | dict(precision="int4", int4_kernel="rowop", k=4)
    return export(ExportConfig(target=str(tiny_models["llama"]), draft="self:1", out=str(out), **opts))


def test_a_half_cache_by_default_where_the_graphs_read_it(rowop_engine):
    m = load_manifest(rowop_engine)
    assert {t.name for t in m.target.graph.inputs} >= {"past_{kind}_{layer}", "past_{kind}_f16_{layer}"}
    half, full = at_load(m), at_load(m, kv_dtype="fp32")
    assert half.kv_cache_dtype == "float16" and full.kv_cache_dtype == "float32"
    assert 2 * kv_bytes_per_token(half) == kv_bytes_per_token(full)
    with pytest.raises(ContextError, match="CPU only"):
        at_load(m, kv_dtype="fp16", provider="cuda")
    assert at_load(m, provider="cuda").kv_cache_dtype == "float32"  # unset: what the provider runs
    outs = {}
    for kv in ("fp16", "fp32"):
        plain = Generator.load(rowop_engine, RuntimeConfig(drafter="none", kv_dtype=kv, max_len=100))
        assert plain.target.kv.dtype == np.dtype(np.float16 if kv == "fp16" else np.float32)
        assert plain.target.kv.shape[2] == 128
        outs[kv] = _ids(plain, 40)
        for drafter in ("draft", "ngram"):  # greedy speculative == plain within each cache type
            g = Generator.load(rowop_engine, RuntimeConfig(drafter=drafter, k=4, kv_dtype=kv, max_len=100))
            assert g.engines.get("draft") is None or g.engines.get("draft").kv.dtype == plain.target.kv.dtype
            assert _ids(g, 40) == outs[kv], (drafter, kv)
    assert outs["fp16"] != [] and len(outs["fp16"]) == len(outs["fp32"])


def test_half_cache_logits_are_near_the_float_caches(rowop_engine):
    """fp16 rounding of K and V moves the logits a little (not bitwise: a different cache)."""
    from edgespec.engines.ort import OrtModel

    m = load_manifest(rowop_engine)
    rows = {}
    for kv in ("fp16", "fp32"):
        mm = at_load(m, kv_dtype=kv)
        e = OrtModel(mm, mm.target)
        e.forward(PROMPT[:16], 0)
        e.commit(0, 16)
        rows[kv] = e.forward(PROMPT[16:18], 16).copy()
    diff = np.abs(rows["fp16"] - rows["fp32"]).max()
    assert 0 < diff < 1e-2 * max(1.0, np.abs(rows["fp32"]).max()), diff
