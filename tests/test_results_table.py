"""tools/results_table.py: the README's results table and its caption come from a bench JSON, old
layout (no date, command, folder or ISA recorded) and new; --check catches a table out of date."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def rt():
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "tools/results_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(drafter: str, k: int, tok_s: float, mal: float, width: float, same: int, **extra) -> dict:
    totals = {
        "tokens_per_s": tok_s,
        "mean_accepted_length": mal,
        "mean_verify_width": width,
        "identical_to_none": same,
        "n_prompts": 3,
    }
    return {"drafter": drafter, "k": k, "adaptive": False, "totals": totals, "prompts": [{}, {}, {}]} | extra


NEW = {  # a bench JSON of the current layout, cut to what the tool reads
    "config": {
        "engine": "engines/x",
        "prompts": "tools/prompts/chat_eval.jsonl",
        "drafters": ["none", "ngram", "hybrid"],
        "k": [2, 4],
        "max_new_tokens": 128,
        "temperature": 0.0,
        "seed": 0,
        "adaptive": True,
        "hybrid_lookup": "suffix",
        "trees": ["6:5:1:1:0.4"],
        "fused_head": True,
        "precision": "int4",
        "date": "2027-01-02T03:04:05Z",
        "limit": 3,
        "command": "edgespec bench --prompts tools/prompts/chat_eval.jsonl --limit 3 --json b.json",
        "folder": {
            "defaults": {"drafter": "ngram", "k": 8, "adaptive": True, "tuned": None},
            "graph_flavour": "lean",
            "portable_ops": ["rotary"],
            "host_prologue": False,
            "two_row_matmuls": True,
            "drafters": ["none", "ngram", "hybrid"],
            "exported": "2027-01-01T00:00:00+00:00",
            "exported_by": "0.1.0",
        },
    },
    "machine": {
        "cpu": "Example CPU 9000",
        "logical_cpus": 4,
        "cpu_cores": 2,
        "provider": "cpu",
        "onnxruntime": "1.32.0",
        "cpu_isa": ["avx2", "avx512f", "avx512_vnni"],
        "edgespec": "0.1.0",
    },
    "runs": [
        _run("none", 0, 50.0, 1.0, 1.0, 3),
        _run("ngram", 2, 60.0, 1.4, 2.0, 3),
        _run("ngram", 4, 55.0, 1.5, 3.0, 3),
        _run("hybrid", 4, 65.0, 1.9, 2.9, 2),
        _run("hybrid", 4, 70.0, 2.0, 2.5, 3, adaptive=True),
        _run("hybrid", 4, 52.0, 1.8, 3.1, 3, tree="6:5:1:1:0.4"),
    ],
}


def _old() -> dict:
    """The same run as a JSON written before bench recorded date, command, folder and ISA."""
    old = copy.deepcopy(NEW)
    for key in ("date", "command", "folder", "limit", "hybrid_lookup"):
        del old["config"][key]
    for key in ("cpu_cores", "cpu_isa", "edgespec"):
        del old["machine"][key]
    return old


def test_table_rows_speedups_and_selection(rt):
    rows = rt.table(NEW, ["none", "hybrid"]).splitlines()
    assert rows[0] == (
        "| drafter | k | tok/s | speedup vs none | mean accepted length (incl. bonus) | mean verify "
        "width | identical to none |"
    )
    assert rows[2:] == [
        "| none | 0 | 50.0 | 1.00x | 1.00 | 1.00 | 3/3 |",
        "| hybrid | 4 | 65.0 | 1.30x | 1.90 | 2.90 | 2/3 |",
        "| hybrid | <=4 adaptive | 70.0 | 1.40x | 2.00 | 2.50 | 3/3 |",
        "| hybrid | tree 6:5:1:1:0.4 | 52.0 | 1.04x | 1.80 | 3.10 | 3/3 |",
    ]
    assert len(rt.table(NEW).splitlines()) == 2 + 6
    sampled = copy.deepcopy(NEW)
    sampled["config"]["temperature"] = 0.7
    assert "identical" not in rt.table(sampled)
    with pytest.raises(ValueError, match="no runs of eagle"):
        rt.table(NEW, ["none", "eagle"])


def test_caption_states_what_the_json_records(rt):
    cap = " ".join(rt.caption(NEW, "docs/b.json").split())
    for part in (
        "3 prompts of `tools/prompts/chat_eval.jsonl`, greedy, 128 new tokens",
        "hybrid pairs the EAGLE head with suffix decoding",
        "folder defaults drafter ngram, k 8 adaptive; lean graph (kept portable: rotary), two-row int4 decode",
        "Example CPU 9000 (avx2, avx512f, avx512_vnni, no AMX), 2 cores, 4 logical CPUs",
        "edgespec 0.1.0",
        "Run on 2027-01-02 (UTC).",
        "```bash edgespec bench --prompts tools/prompts/chat_eval.jsonl --limit 3 --json b.json ```",
    ):
        assert part in cap, part
    assert "not recorded" not in cap and "rebuilt" not in cap


def test_caption_of_an_older_json_says_what_is_missing_and_rebuilds_the_command(rt):
    cap = " ".join(rt.caption(_old(), "docs/b.json", note="Measured on an older machine.").split())
    for part in (
        "folder defaults and graph flavour not recorded",
        "ISA extensions not recorded",
        "Date not recorded",
        "Measured on an older machine.",
        "rebuilt from the JSON's config",
    ):
        assert part in cap, part
    cmd, recorded = rt.command(_old(), "docs/b.json")
    assert not recorded
    assert cmd == (
        "edgespec bench --engine engines/x --prompts tools/prompts/chat_eval.jsonl --limit 3 --drafter "
        "none,ngram,hybrid --k 2,4 --adaptive --tree 6:5:1:1:0.4 --json docs/b.json"
    )
    humaneval = _old()
    humaneval["config"] |= {"prompts": "HumanEval[:20]", "temperature": 1.0}
    assert rt.command(humaneval, "b.json")[0] == (
        "edgespec bench --engine engines/x --drafter none,ngram,hybrid "
        "--k 2,4 --adaptive --tree 6:5:1:1:0.4 --temperature 1.0 --seed 0 "
        "--json b.json"
    )


def test_readme_block_written_regenerated_and_checked(rt, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(NEW))
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Results\n\n<!-- results:begin -->\nstale\n<!-- results:end -->\n\nAfter.\n")
    assert rt.main([str(bench), "--drafters", "none,hybrid", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# x\n\n## Results\n\n<!-- results:begin {")
    assert text.endswith("<!-- results:end -->\n\nAfter.\n")
    assert "stale" not in text and "| hybrid | <=4 adaptive |" in text and "| ngram |" not in text
    assert rt.main(["--readme", str(readme), "--check"]) == 0  # the marker keeps the file and the options
    rerun = copy.deepcopy(NEW)
    rerun["runs"][0]["totals"]["tokens_per_s"] = 49.0
    bench.write_text(json.dumps(rerun))
    assert rt.main(["--readme", str(readme), "--check"]) == 1  # a new run of the same file: the table is stale
    assert rt.main(["--readme", str(readme)]) == 0 and "| none | 0 | 49.0 |" in readme.read_text()
    bench.write_text(json.dumps(NEW | {"runs": NEW["runs"][:2]}))
    with pytest.raises(ValueError, match="no runs of hybrid"):
        rt.main(["--readme", str(readme)])
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- results:begin"):
        rt.main([str(bench), "--readme", str(readme)])


def test_the_readme_table_is_what_its_json_gives(rt):
    assert rt.main(["--check"]) == 0, "README.md's results table is stale. Hint: python tools/results_table.py"


PEERS = {
    "config": {
        "engine": "engines/x",
        "edgespec": "none,ngram:8:adaptive",
        "gguf": "/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
        "limit": 20,
        "max_new_tokens": 128,
        "threads": 2,
    },
    "machine": {"cpu": "AMD EPYC", "logical_cpus": 2, "onnxruntime": "1.32.0"},
    "skipped": {"transformers": "not installed"},
    "rows": [
        {"system": "edgespec none", "note": "int4", "tokens_per_s": 200.0, "itl_ms": {"p50": 4.8}, "ttft_ms": 40.0},
        {"system": "llama.cpp plain", "note": "Q4_1", "tokens_per_s": 100.0, "itl_ms": {"p50": 9.6}, "ttft_ms": 55.0},
    ],
}


def test_two_blocks_a_bench_and_the_peers_each_from_its_own_json(rt, tmp_path):
    bench, peers = tmp_path / "bench.json", tmp_path / "peers.json"
    bench.write_text(json.dumps(NEW))
    peers.write_text(json.dumps(PEERS))
    readme = tmp_path / "README.md"
    second = f'<!-- results:begin {{"json": "{peers}"}} -->\n<!-- results:end -->\n'
    readme.write_text("<!-- results:begin -->\nold\n<!-- results:end -->\nmid\n" + second)
    assert rt.main([str(bench), "--readme", str(readme)]) == 0  # no block names it: the first
    assert rt.main(["--readme", str(readme)]) == 0  # every block from its own JSON
    text = readme.read_text()
    assert (
        "| edgespec none | 200.0 | 2.00x | 4.80 | 40 | int4 |" in text and "| llama.cpp plain | 100.0 | 1.00x |" in text
    )
    assert "Skipped: transformers: not installed." in text and "| hybrid | <=4 adaptive |" in text
    assert rt.main(["--readme", str(readme), "--check"]) == 0
    peers.write_text(json.dumps(PEERS | {"rows": PEERS["rows"][::-1]}))
    assert rt.main(["--readme", str(readme), "--check"]) == 1  # the second block is stale
    assert rt.main([str(peers), "--readme", str(readme)]) == 0  # the block that names it
    assert readme.read_text().index("| llama.cpp plain |") < readme.read_text().index("| edgespec none |")


def test_adaptive_only_keeps_plain_and_the_adaptive_rows(rt, tmp_path):
    report = copy.deepcopy(NEW)
    fixed = copy.deepcopy(next(r for r in report["runs"] if r.get("adaptive")))
    report["runs"].append(fixed | {"adaptive": False})
    rows = rt.table(report, adaptive_only=True).splitlines()[2:]
    assert rows[0].startswith("| none | 0 |") and all("adaptive" in r for r in rows[1:]) and len(rows) >= 2
    bench, readme = tmp_path / "bench.json", tmp_path / "README.md"
    bench.write_text(json.dumps(report))
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    assert rt.main([str(bench), "--adaptive-only", "--readme", str(readme)]) == 0
    assert '"adaptive_only": true' in readme.read_text() and rt.main(["--readme", str(readme), "--check"]) == 0
