"""Published Medusa heads (layout id `medusa-official`: FasterDecoding Medusa, medusa-llm 0.1, the
repo's train_legacy.py and the axolotl fork's Medusa-2), in and out, against fixtures Medusa's own
code wrote (tools/published_fixtures/medusa.py):

- each fixture (medusa_lm_head.pt fp16 / fp32, 0 / 1 / 2 ResBlocks, .safetensors bf16, version "2",
  a Medusa-2 model) exports through `--medusa FOLDER` alone with the tiny llama target (a Medusa-2
  model: itself as --target); the heads graph matches Medusa's forward (fp32, < 1e-4) on the
  recorded features; speculative greedy == plain greedy, chains and trees;
- each honoured field (own LM heads, biases, repeated blocks) moves Medusa's output far past the
  tolerance (recorded sensitivity);
- every refused field or broken folder stops the export before the target loads, in one line;
- edgespec's heads written by `export-drafter --format medusa-official` are what Medusa's class
  loaded when the fixtures were made (all its keys, its logits = edgespec's), and exported back
  they give the same graph, byte for byte.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

FIX = Path(__file__).parent / "fixtures" / "published"
VARIANTS = ["pt-fp16", "pt-fp32-l2", "pt-fp32-l0", "st-bf16", "v2-st-bf16", "medusa2-bf16"]
IDS = [f"medusa-official-{v}" for v in VARIANTS]
TOL = 1e-4
TINY = ["--max-len", "128", "--k", "4", "--prefill-chunk", "16", "--kv-bucket", "32", "--precision", "fp32", "--trees"]


def ref(name: str) -> dict:
    with np.load(FIX / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The tiny llama target, its (tied) LM head the table the fixtures' base had (recorded)."""
    from tiny import make_tiny
    from transformers import AutoModelForCausalLM

    folder = make_tiny("llama", tmp_path_factory.mktemp("pubmd") / "llama")
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.from_numpy(ref("medusa-official-v2-st-bf16")["lm_head"]))
    model.save_pretrained(folder)
    return folder


def cli(capsys, *argv) -> tuple[int, str]:
    from helpers.cli import run_cli

    return run_cli(capsys, *argv)


def export_cli(capsys, target: Path, heads: Path, out: Path, *more) -> Path:
    rc, err = cli(capsys, "export", "--target", target, "--medusa", heads, "--out", out, *TINY, *more)
    assert rc == 0, err
    return out


_EXPORTS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def exported(target, tmp_path_factory):
    """fixture name -> its engine folder, exported once per module through the CLI flag alone."""
    from edgespec.cli import main  # capsys is function-scoped: main itself here

    def get(name: str) -> Path:
        if name not in _EXPORTS:
            out = tmp_path_factory.mktemp("pubmd_eng") / name
            tgt = FIX / name if name.endswith("medusa2-bf16") else target  # a Medusa-2 model is its own target
            more = [] if name == "medusa-official-pt-fp32-l2" else ["--no-validate"]  # edgespec's own check, once
            argv = ["export", "--target", tgt, "--medusa", FIX / name, "--out", out, *TINY, *more]
            assert main([str(a) for a in argv]) == 0
            _EXPORTS[name] = out
        return _EXPORTS[name]

    yield get
    _EXPORTS.clear()


def heads_diff(folder: Path, r: dict) -> float:
    """max |heads graph - Medusa's forward| over the recorded positions, on the graph's draft vocabulary."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.drafters.medusa.engine import OrtHeads

    man = load_manifest(folder)
    engine = OrtHeads(man, man.models()["medusa"])
    got = np.stack([engine.forward(f).copy() for f in r["features"]], 1)  # [K, T, Vd]
    return float(np.abs(got - r["logits"][:, :, engine.d2t]).max())


@pytest.mark.parametrize("name", IDS)
def test_exports_and_matches_medusa(exported, name):
    from edgespec.engines.manifest import load_manifest

    r = ref(name)
    folder = exported(name)
    heads = load_manifest(folder).models()["medusa"]
    K = r["logits"].shape[0]
    assert heads.n_heads == K and heads.vocab_size == 256  # Medusa drafts over the whole vocabulary
    diff = heads_diff(folder, r)
    assert diff < TOL, f"{name}: heads graph vs Medusa's forward differ by {diff:.2e}"
    if name == "medusa-official-pt-fp32-l2":  # validated at export: per-head LM heads, 2 blocks
        assert heads.validation["heads"] < 1e-4


@pytest.mark.parametrize(
    "name", ["medusa-official-pt-fp16", "medusa-official-pt-fp32-l2", "medusa-official-pt-fp32-l0"]
)
def test_honoured_fields_change_the_output(name):
    """Each field the match relies on moves Medusa's logits far past the tolerance when left out: the
    heads' own LM heads, the ResBlocks' biases, the repeated ResBlock (medusa_num_layers 2)."""
    r = ref(name)
    sens = {k.removeprefix("sensitivity_"): float(v) for k, v in r.items() if k.startswith("sensitivity_")}
    want = {"own_lm_heads"} | ({"bias"} if not name.endswith("l0") else set()) | ({"blocks"} if "l2" in name else set())
    assert set(sens) == want
    assert min(sens.values()) > 100 * TOL, sens


@pytest.mark.parametrize(
    "name", ["medusa-official-pt-fp16", "medusa-official-v2-st-bf16", "medusa-official-medusa2-bf16"]
)
def test_speculative_greedy_equals_plain(exported, name):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    folder = exported(name)
    g = Generator.load(folder, RuntimeConfig(drafter="none", k=4, adaptive=False, medusa_min_confidence=0.0))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 256, n) for n in (5, 23)]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 24)]) for p in prompts]
    g.set_drafter("medusa", 4)
    tree = Generator.load(
        folder,
        RuntimeConfig(drafter="medusa", k=4, adaptive=False, tree=TreeConfig(nodes=5, depth=3, branch=2, beam=2)),
    )
    for gen in (g, tree):
        drafted = 0
        for p, want in zip(prompts, plain, strict=True):
            assert np.array_equal(np.concatenate([x.copy() for x in gen.generate_ids(p, 24)]), want), name
            drafted += gen.last_stats.n_drafted
        assert drafted > 0


@pytest.mark.parametrize("precision", ["int4", "fp16"])
def test_per_head_lm_heads_at_other_precisions(target, tmp_path, capsys, precision):
    """Each head's own LM head as its own product (int4: MatMulNBits each): validated against PyTorch
    at export, and lossless."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    tiny = [precision if a == "fp32" else a for a in TINY]
    rc, err = cli(
        capsys,
        "export",
        "--target",
        target,
        "--medusa",
        FIX / "medusa-official-pt-fp16",
        "--out",
        tmp_path / "e",
        *tiny,
    )
    assert rc == 0, err
    heads = load_manifest(tmp_path / "e").models()["medusa"]
    # int4: int8 activations in MatMulNBits (1.3e-2 here, within the export's own tolerance); fp16: 6.5e-4
    assert heads.precision == precision and heads.validation["heads"] < (5e-2 if precision == "int4" else 1e-3)
    g = Generator.load(tmp_path / "e", RuntimeConfig(drafter="none", k=4, adaptive=False, medusa_min_confidence=0.0))
    prompt = np.arange(5, 30)
    want = np.concatenate([x.copy() for x in g.generate_ids(prompt, 24)])
    g.set_drafter("medusa", 4)
    assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 24)]), want)
    assert g.last_stats.n_drafted > 0


# ---- refused before the target loads ----------------------------------------------------------------
def _copy(tmp_path: Path, name: str, config=None, tensors=None) -> Path:
    """A copy of fixture `name`, its config.json changed by `config` (dict -> None) and the tensors of
    its medusa_lm_head.pt by `tensors` (dict -> None)."""
    folder = tmp_path / "bad"
    shutil.copytree(FIX / name, folder)
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    if tensors:
        sd = torch.load(folder / "medusa_lm_head.pt")
        tensors(sd)
        torch.save(sd, folder / "medusa_lm_head.pt")
    return folder


def _pop(key):
    return lambda d: d.pop(key)


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


REFUSED = {  # case -> (fixture, config edit, tensors edit, what the one line says)
    "unknown-config-key": ("pt-fp16", _set("truncated_vocab_size", 100), None, "truncated_vocab_size: not a setting"),
    "unknown-medusa-key": ("medusa2-bf16", _set("medusa_num_unfreeze_layers", 2), None, "medusa_num_unfreeze_layers"),
    "version-3": ("pt-fp16", _set("version", "3"), None, "version '3'"),
    "version-2-with-lm-heads": ("pt-fp16", _set("version", "2"), None, 'says version "2"'),
    "fewer-heads-in-config": ("pt-fp16", _set("medusa_num_heads", 2), None, "medusa_num_heads to 3"),
    "more-heads-in-config": ("pt-fp16", _set("medusa_num_heads", 4), None, "head 3 has no ResBlock weights"),
    "layers-0-for-1": ("pt-fp16", _set("medusa_num_layers", 0), None, "are not Medusa heads of 3 x 0"),
    "num-layers-not-int": ("pt-fp16", _set("medusa_num_layers", "1"), None, "medusa_num_layers '1' is not an integer"),
    "no-config": ("pt-fp16", None, None, "no config.json"),
    "lm-head-bias": ("pt-fp16", None, lambda sd: sd.__setitem__("0.1.bias", torch.zeros(256)), "0.1.bias: a bias"),
    "some-heads-without-lm-head": ("pt-fp16", None, _pop("1.1.weight"), "heads [0, 2] have their own LM head"),
    "block-without-bias": ("pt-fp16", None, _pop("2.0.linear.bias"), "head 2 block 0 has a weight or a bias"),
    "int-weights": (
        "pt-fp16",
        None,
        lambda sd: sd.__setitem__("0.0.linear.bias", torch.zeros(64, dtype=torch.int32)),
        "heads stored as",
    ),
    "lm-head-of-another-vocab": (
        "pt-fp16",
        None,
        lambda sd: [sd.__setitem__(f"{i}.1.weight", torch.zeros(300, 64, dtype=torch.float16)) for i in range(3)],
        "have 300 rows, the target's vocabulary 256",
    ),
    "hidden-size": (
        "pt-fp32-l0",
        None,
        lambda sd: [sd.__setitem__(f"{i}.0.weight", torch.zeros(256, 32)) for i in range(2)],
        "of hidden size 32 do not fit the target's 64",
    ),
    "medusa2-with-another-target": ("medusa2-bf16", None, None, "is a Medusa-2 model"),
    "d2t-without-draft-vocab": (
        "pt-fp16",
        None,
        lambda sd: sd.__setitem__("d2t", torch.zeros(8, dtype=torch.int64)),
        "d2t",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_broken_folders_are_refused_before_the_target_loads(case, target, tmp_path, capsys, target_never_loads):
    variant, config, tensors, says = REFUSED[case]
    folder = _copy(tmp_path, f"medusa-official-{variant}", config, tensors)
    if case == "no-config":
        (folder / "config.json").unlink()
    tgt = folder if variant == "medusa2-bf16" and case != "medusa2-with-another-target" else target
    t0 = time.perf_counter()
    rc, err = cli(capsys, "export", "--target", tgt, "--medusa", folder, "--out", tmp_path / "out", *TINY)
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("edgespec export: error: ")]
    assert rc == 2 and len(lines) == 1, err
    assert says in lines[0] and "--medusa" in lines[0], lines[0]
    assert time.perf_counter() - t0 < 10


def _untie(sd: dict) -> None:
    """Head 0's block 1 its own tensor, other values (the .pt stores the tied blocks as one tensor)."""
    sd["0.1.linear.weight"] = sd["0.1.linear.weight"] + 1.0


def test_what_only_the_values_show_is_refused_at_read(target, tmp_path):
    """Two heads files that disagree, and a head whose repeated ResBlocks differ (Medusa ties them,
    other loaders do not): seen once the weights are read, refused with the reason."""
    from safetensors.torch import save_file

    from edgespec.export.drafters.medusa.checkpoint import MedusaFormatError, read_any

    folder = _copy(tmp_path, "medusa-official-pt-fp32-l2", tensors=_untie)
    with pytest.raises(MedusaFormatError, match=r"head 0's ResBlocks \[0, 1\] hold different weights"):
        read_any(folder, 64, 256)
    folder = tmp_path / "both"
    shutil.copytree(FIX / "medusa-official-pt-fp16", folder)
    sd = torch.load(folder / "medusa_lm_head.pt")
    save_file({k: v + 1 for k, v in sd.items()}, str(folder / "medusa_lm_head.safetensors"))
    with pytest.raises(MedusaFormatError, match="hold different values"):
        read_any(folder, 64, 256)


def test_a_medusa_folder_given_to_another_flag_is_taken_as_medusa(target, tmp_path, capsys):
    """A Medusa folder passed to --eagle is claimed by the medusa drafter: the format says what it is."""
    from edgespec.engines.manifest import load_manifest

    out = tmp_path / "eng"
    heads = FIX / "medusa-official-pt-fp32-l0"
    rc, err = cli(capsys, "export", "--target", target, "--eagle", heads, "--out", out, *TINY, "--no-validate")
    assert rc == 0, err
    models = load_manifest(out).models()
    assert "medusa" in models and "eagle" not in models


# ---- the way out -------------------------------------------------------------------------------------
def _edgespec_heads(tmp_path: Path, target: Path) -> Path:
    """The publish fixture's edgespec heads, their medusa.target set to this test's tiny llama."""
    heads = tmp_path / "heads"
    shutil.copytree(FIX / "medusa-official-publish" / "heads", heads)
    cfg = json.loads((heads / "config.json").read_text())
    cfg["medusa"]["target"] = str(target)
    (heads / "config.json").write_text(json.dumps(cfg))
    return heads


def test_published_heads_are_what_medusa_loaded_and_come_back_identical(target, tmp_path, capsys):
    r = ref("medusa-official-publish")
    heads = _edgespec_heads(tmp_path, target)
    pub = tmp_path / "pub"
    rc, err = cli(capsys, "export-drafter", heads, "--format", "medusa-official", "--out", pub)
    assert rc == 0, err
    # what Medusa's class loaded when the fixtures were written: every key it has, d2t its only extra
    assert list(r["missing"]) == [] and list(r["unexpected"]) == ["d2t"]
    now = torch.load(pub / "medusa_lm_head.pt")
    then = torch.load(FIX / "medusa-official-publish/published/medusa_lm_head.pt")
    assert list(now) == list(then) and all(torch.equal(now[k], then[k]) for k in now)
    cfg = json.loads((pub / "config.json").read_text())
    assert cfg == json.loads((FIX / "medusa-official-publish/published/config.json").read_text()) | {
        "base_model_name_or_path": str(target.resolve())
    }
    # the LM head written into every head is the target's, and Medusa's logits are edgespec's heads' own
    lm = ref("medusa-official-v2-st-bf16")["lm_head"]
    assert all(np.array_equal(now[f"{i}.1.weight"].numpy(), lm) for i in range(3))
    orig = export_cli(capsys, target, heads, tmp_path / "orig", "--no-validate")
    diff = heads_diff(orig, r)
    assert diff < TOL, f"Medusa's forward on the published heads vs edgespec's heads graph: {diff:.2e}"
    # exported back: the heads' own LM heads are the target's, so the graph is the one before, byte for byte
    back = export_cli(capsys, target, pub, tmp_path / "back", "--no-validate")
    for f in ("medusa.onnx", "medusa.weights"):
        assert (orig / f).read_bytes() == (back / f).read_bytes(), f


def test_publish_refuses_what_the_layout_cannot_carry(target, tmp_path, capsys):
    """Different ResBlocks within a head (Medusa repeats one module), and heads whose target is unknown."""
    from safetensors.numpy import load_file, save_file

    heads = _edgespec_heads(tmp_path, target)
    w = load_file(str(heads / "model.safetensors"))
    cfg = json.loads((heads / "config.json").read_text())
    two = tmp_path / "two"
    two.mkdir()
    w2 = w | {f"{i}.1.linear.{p}": w[f"{i}.0.linear.{p}"] * 0.5 for i in range(3) for p in ("weight", "bias")}
    save_file(w2, str(two / "model.safetensors"))
    (two / "config.json").write_text(json.dumps(cfg | {"medusa_num_layers": 2}))
    rc, err = cli(capsys, "export-drafter", two, "--format", "medusa-official", "--out", tmp_path / "o1")
    assert rc == 2 and "head 0's ResBlocks 0 and 1 differ" in err and "Traceback" not in err, err
    cfg["medusa"].pop("target")
    (heads / "config.json").write_text(json.dumps(cfg))
    rc, err = cli(capsys, "export-drafter", heads, "--format", "medusa-official", "--out", tmp_path / "o2")
    assert rc == 2 and "does not say which model" in err and "Traceback" not in err, err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_published_medusa_heads_republish_as_they_are(tmp_path, capsys):
    """A Medusa folder (own LM heads) given to export-drafter comes out with the same tensors, as a .pt."""
    out = tmp_path / "o"
    rc, err = cli(
        capsys, "export-drafter", FIX / "medusa-official-st-bf16", "--format", "medusa-official", "--out", out
    )
    assert rc == 0, err
    from safetensors.torch import load_file

    src = load_file(str(FIX / "medusa-official-st-bf16/medusa_lm_head.safetensors"))
    got = torch.load(out / "medusa_lm_head.pt")
    assert set(got) == set(src) and all(torch.equal(got[k].float(), src[k].float()) for k in src)
