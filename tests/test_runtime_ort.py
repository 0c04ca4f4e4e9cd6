"""The runtime on real ONNX Runtime sessions of a tiny exported model."""

import json
import subprocess
import sys

import pytest

from edgespec.engines.base import EngineError
from edgespec.engines.manifest import ManifestError, load_manifest
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator, PromptTooLongError
from edgespec.runtime.sampling import SamplingConfig

PROMPT = "hello hello world, hello world again and again; hello"


def ids_of(g, prompt, n, **kw):
    return [int(t) for c in g.generate_ids(g.codec.encode(prompt), n, **kw) for t in c]


@pytest.fixture(scope="module")
def gen(tiny_engine):
    return Generator.load(tiny_engine, RuntimeConfig(drafter="none"))


@pytest.mark.parametrize("drafter", ["ngram", "draft"])
def test_greedy_identical_to_plain_for_every_k(gen, drafter):
    gen.set_drafter("none")
    ref = ids_of(gen, PROMPT, 100)
    for k in range(1, 9):
        gen.set_drafter(drafter, k)
        assert ids_of(gen, PROMPT, 100) == ref, f"{drafter} k={k} diverged"
        st = gen.last_stats
        assert st.n_drafted > 0 and st.n_target_calls <= 100


def test_long_prompt_crosses_prefill_chunks_and_buckets(gen):
    prompt = "abcdefghij" * 9 + "abc"  # 93 tokens: 5 prefill chunks of 16, 3 KV buckets of 32
    gen.set_drafter("none")
    ref = ids_of(gen, prompt, 60)
    gen.set_drafter("ngram", 5)
    assert ids_of(gen, prompt, 60) == ref
    assert gen.last_stats.mean_accepted_length > 1.0


def test_stream_text_and_stats(gen):
    gen.set_drafter("ngram", 4)
    text = "".join(gen.stream(PROMPT, max_new_tokens=30))
    assert isinstance(text, str) and len(text) > 0
    d = gen.last_stats.to_dict()
    for key in (
        "ttft_ms",
        "itl_ms",
        "tokens_per_s",
        "acceptance_rate",
        "mean_accepted_length",
        "acceptance_by_position",
        "target_calls",
        "draft_calls",
        "time_split_s",
    ):
        assert key in d
    assert d["tokens"] == 30 and "incl. bonus" in gen.last_stats.line()


def test_chat_messages_go_through_the_template(gen):
    msgs = [{"role": "user", "content": "hi"}]
    assert gen.codec.render_chat(msgs) == "<user>hi\n<assistant>"
    assert len(gen.codec.encode(msgs)) == len("<user>hi\n<assistant>")  # char-level tiny tokenizer


def test_stop_strings_cut_the_text(gen):
    gen.set_drafter("none")
    full = "".join(gen.stream(PROMPT, max_new_tokens=40))
    stop = full[10:13]
    cut = "".join(gen.stream(PROMPT, max_new_tokens=40, stop=[stop]))
    assert cut == full[: full.find(stop)] and gen.last_stats.finish_reason == "stop"


def test_prompt_past_the_context_is_refused(gen):
    with pytest.raises(PromptTooLongError, match="context is 256"):
        ids_of(gen, "x" * 300, 5)


def test_sampling_runs_and_is_seeded(gen):
    gen.set_drafter("draft", 3)
    a = ids_of(gen, PROMPT, 30, sampling=SamplingConfig(temperature=0.9, top_p=0.95, seed=1))
    b = ids_of(gen, PROMPT, 30, sampling=SamplingConfig(temperature=0.9, top_p=0.95, seed=1))
    assert a == b


def test_kv_memory_is_allocated_once(gen):
    adaptive = gen.cfg.adaptive
    gen.reconfigure(drafter="draft", k=4, adaptive=False)  # a fixed k: the widths used do not depend on timing
    try:
        ids_of(gen, PROMPT, 50)
        kv_id = id(gen.target.kv), id(gen.engines.get("draft").kv)
        n_bindings = len(gen.target._bindings)
        ids_of(gen, PROMPT, 150)
        assert (id(gen.target.kv), id(gen.engines.get("draft").kv)) == kv_id
        assert len(gen.target._bindings) <= n_bindings + 8  # at most one per new (width, bucket)
    finally:
        gen.reconfigure(adaptive=adaptive)


def test_manifest_errors_are_clear(tiny_engine, tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.mkdir()
    d = json.loads((tiny_engine / "manifest.json").read_text())
    d["version"] = 99
    (bad / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="version 99"):
        load_manifest(bad)


def test_thread_pool_is_shared_only_before_the_first_session(tiny_engine):
    from edgespec.engines import ort as eo

    m = load_manifest(tiny_engine)
    eo.OrtModel(m, m.target).session()  # this process has sessions with their own pools now
    with pytest.raises(EngineError, match="before the first session"):
        eo.share_thread_pool()


def test_runtime_never_imports_torch_or_transformers():
    code = (
        "import sys, edgespec, edgespec.runtime.generator, edgespec.runtime.apps.bench, edgespec.engines.ort, "
        "edgespec.cli; bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_generate_and_bench(tiny_engine, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "a", "prompt": PROMPT})
        + "\n"
        + json.dumps({"id": "b", "messages": [{"role": "user", "content": "hi hi"}]})
        + "\n"
    )
    out = tmp_path / "b.json"
    cmd = [
        sys.executable,
        "-m",
        "edgespec.cli",
        "bench",
        "--engine",
        str(tiny_engine),
        "--prompts",
        str(prompts),
        "--drafter",
        "none,ngram,draft",
        "--k",
        "2,4",
        "--max-new-tokens",
        "20",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "speedup vs none" in res.stdout
    rep = json.loads(out.read_text())
    assert set(rep) == {"config", "machine", "runs"} and len(rep["runs"]) == 5
    # what a results table cites: when, how, on what machine, with which folder defaults and graph
    assert rep["config"]["command"].startswith("edgespec bench --engine ") and rep["config"]["date"].endswith("Z")
    assert {"drafter", "k", "adaptive"} <= set(rep["config"]["folder"]["defaults"])
    assert rep["config"]["folder"]["graph_flavour"] in ("lean", "portable")
    assert {"cpu", "cpu_cores", "cpu_isa", "onnxruntime", "edgespec"} <= set(rep["machine"])
    for run in rep["runs"]:
        assert {"drafter", "k", "totals", "prompts"} <= set(run)
        assert {
            "tokens",
            "seconds",
            "tokens_per_s",
            "mean_accepted_length",
            "acceptance_rate",
            "itl_ms",
            "ttft_ms",
        } <= set(run["totals"])
        assert run["totals"]["identical_to_none"] == 2
        assert {"id", "output_ids", "tokens", "seconds"} <= set(run["prompts"][0])
    # the CLI runs every session on one shared pool; a pool per session gives the same tokens
    own = tmp_path / "own.json"
    res = subprocess.run(cmd[:-1] + [str(own), "--thread-pool", "session"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    ids = [[p["output_ids"] for p in run["prompts"]] for run in json.loads(out.read_text())["runs"]]
    assert ids == [[p["output_ids"] for p in run["prompts"]] for run in json.loads(own.read_text())["runs"]]
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "generate",
            "--engine",
            str(tiny_engine),
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "10",
        ],
        capture_output=True,
        text=True,
    )
    assert gen.returncode == 0 and "tok/s" in gen.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "edgespec.cli", "generate", "--engine", str(tmp_path / "none"), "--prompt", "x"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_tune_records_the_fastest_lossless_setting(tiny_engine, tmp_path):
    import shutil

    folder = tmp_path / "eng"
    shutil.copytree(tiny_engine, folder)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": PROMPT[i:]}) + "\n" for i in range(3)))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "tune",
            "--engine",
            str(folder),
            "--prompts",
            str(prompts),
            "--limit",
            "3",
            "--max-new-tokens",
            "24",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "workload:" in res.stdout and "decision:" in res.stdout
    m = load_manifest(folder)
    assert m.defaults.drafter in ("none", "ngram", "suffix", "draft", "recycle", "merged") and m.defaults.tuned.table
    g = Generator.load(folder)
    assert g.drafter.name == m.defaults.drafter
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "generate",
            "--engine",
            str(folder),
            "--prompt",
            "hi",
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
    )
    assert "tuned" in gen.stderr


def test_bench_unseeded_samples_as_a_request_without_seed(tiny_engine, tmp_path):
    """`bench --unseeded`: every call draws afresh (the path of an API request without "seed"), the
    JSON says so, and two runs differ where a seeded run would repeat itself; --adaptive-only leaves
    the fixed-k rows out."""
    prompts, outs = tmp_path / "p.jsonl", []
    prompts.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n")
    for i in range(2):
        out = tmp_path / f"u{i}.json"
        cmd = ["bench", "--engine", str(tiny_engine), "--prompts", str(prompts), "--drafter", "none,ngram", "--k", "2"]
        cmd += ["--adaptive", "--adaptive-only", "--temperature", "1.0", "--unseeded", "--max-new-tokens", "24"]
        cmd += ["--json", str(out)]
        res = subprocess.run([sys.executable, "-m", "edgespec.cli", *cmd], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        rep = json.loads(out.read_text())
        assert rep["config"]["unseeded"] is True and rep["config"]["temperature"] == 1.0
        assert [(r["drafter"], r["adaptive"]) for r in rep["runs"]] == [("none", False), ("ngram", True)]
        outs.append([p["output_ids"] for run in rep["runs"] for p in run["prompts"]])
    assert outs[0] != outs[1]
