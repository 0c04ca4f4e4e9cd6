"""The heads' fit check (export/fit.py): step-1 acceptance against the folder's own target, at export
and in `edgespec check`; a check that cannot run is one line, never a traceback."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny import tiny_eagle_head  # noqa: E402

from edgespec.export.fit import check_prompts, fit_check, report_lines  # noqa: E402

SMALL = dict(k=4, prefill_chunk=16, kv_bucket=32, precision="fp32", trees=False, progress=False)


def _export(tiny_models, head_dir, out, max_len=256, **kw):
    from edgespec.export.target.exporter import ExportConfig, export

    target = str(tiny_models["llama"])
    return export(ExportConfig(target=target, eagle=str(head_dir), out=str(out), max_len=max_len, **SMALL, **kw))


@pytest.fixture(scope="module")
def fit_engine(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", noise=0.01)
    return _export(tiny_models, head_dir, root / "engine")


def test_export_records_and_prints_the_fit(fit_engine, capsys):
    m = json.loads((fit_engine / "manifest.json").read_text())
    fit = m["head_fit"]
    assert fit["prompts"] >= 1 and fit["positions"] >= 8 * fit["prompts"]
    assert 0.0 <= fit["ngram"] <= 1.0 and 0.0 <= fit["heads"]["eagle"]["step1"] <= 1.0
    assert fit["heads"]["eagle"]["covered"] == 1.0  # the full vocabulary: every target token draftable
    # the same figures when run again on the finished folder (greedy, the same graphs)
    again = fit_check(fit_engine)
    assert again["heads"]["eagle"]["step1"] == fit["heads"]["eagle"]["step1"] and again["ngram"] == fit["ngram"]


def test_report_names_the_fine_tune_below_prompt_lookup():
    fit = {"prompts": 2, "positions": 80, "ngram": 0.3, "seconds": 1.0, "heads": {"eagle": {"step1": 0.2}}}
    lines = report_lines(fit, "F")
    below = [line for line in lines if "worse than prompt lookup" in line]
    assert len(below) == 1 and "edgespec train-eagle --init" in below[0] and "--engine F" in below[0]
    fit["heads"]["eagle"]["step1"] = 0.4
    assert not any("worse" in line for line in report_lines(fit))


def test_check_prompts_are_training_mix_not_eval():
    from edgespec.export.train.text_data import eval_windows, windows

    rows = check_prompts()
    assert len(rows) >= 12 and all(r[-1]["role"] == "user" for r in rows)
    ev = eval_windows()
    for r in rows:
        assert not windows("\n".join(m["content"] for m in r)) & ev, r


def test_no_prompt_fits_max_len_exports_with_one_line(tiny_models, tmp_path, capsys):
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], tmp_path / "head", noise=0.01)
    out = _export(tiny_models, head_dir, tmp_path / "engine", max_len=64)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "fit check" in line]
    assert len(lines) == 1 and "no check prompt fits max_len 64" in lines[0] and "Traceback" not in err
    fit = json.loads((out / "manifest.json").read_text())["head_fit"]
    assert "positions" not in fit and "max_len 64" in fit["heads"]["eagle"]["reason"]


def _head_with_d2t(model_dir, out, d2t: np.ndarray):
    """A tiny target's head (a copy of its last layer) proposing only the target ids d2t."""
    from transformers import AutoModelForCausalLM

    from edgespec.export.drafters.eagle.checkpoint import save_head
    from edgespec.export.drafters.eagle.head import build_head, init_arrays
    from edgespec.export.target.arch import arch_from_config

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    arch = arch_from_config(model.config, 256)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    hc, arrays = init_arrays(arch, sd, d2t.astype(np.int64), 0)
    cos, sin = arch.rope_tables()
    embed = sd["model.embed_tokens.weight"]
    save_head(build_head(hc, arrays, embed, sd.get("lm_head.weight", embed), cos, sin), out)
    return out


def test_a_cut_vocabulary_that_never_covers_the_answers_is_one_line(fit_engine, tiny_models, tmp_path, capsys):
    from edgespec.export import fit
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(fit_engine, RuntimeConfig(drafter="ngram", k=4, adaptive=False))
    answers, _ = fit._answers(g, fit.FitConfig())
    g.close()
    seen = set(np.concatenate([t[n:] for t, n, _, _ in answers]).tolist())
    unused = np.array([i for i in range(256) if i not in seen][:2])  # ids the target never answers with here
    head_dir = _head_with_d2t(tiny_models["llama"], tmp_path / "cut", unused)
    capsys.readouterr()
    out = _export(tiny_models, head_dir, tmp_path / "engine")
    err = capsys.readouterr().err
    rec = json.loads((out / "manifest.json").read_text())["head_fit"]
    assert "holds none of the target's" in rec["heads"]["eagle"]["reason"]
    assert sum("holds none" in line for line in err.splitlines()) == 1 and "Traceback" not in err


def test_cli_check_reports_the_fit(fit_engine, capsys):
    from edgespec.cli import main

    assert main(["check", str(fit_engine)]) == 0
    out = capsys.readouterr().out
    assert "fit check" in out and "eagle:" in out and "at export: prompt lookup" in out
    assert main(["check", str(fit_engine), "--no-fit-check"]) == 0
    assert "fit check" not in capsys.readouterr().out
