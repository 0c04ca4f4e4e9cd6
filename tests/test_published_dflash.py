"""Published DFlash drafters (layout id `dflash-zlab`: z-lab's DFlashDraftModel, package `dflash`
0.1.0), in and out, against fixtures z-lab's own code wrote (tools/published_fixtures/dflash.py):

- each fixture (bf16 / fp16 / fp32, Qwen3- and Llama-3.1-shaped, every variant flag) exports
  through `--dflash FOLDER` alone with a 6-layer make_tiny target of its family whose embedding and
  LM head are the fixture's recorded ones; the target graphs output the layers z-lab's
  extract_context_feature reads; the drafter graph's logits match z-lab's forward (fp32, < 1e-4)
  on two calls (the second reads the first's cached context); speculative greedy == plain greedy;
- each honoured field changes z-lab's output by far more than the tolerance (recorded sensitivity);
- every refused field or broken folder stops the export before the target loads, in one line;
- edgespec's drafter published in z-lab's layout (`export-drafter --format dflash-zlab`) is what
  z-lab's class, loading it, computed; exported back, it drafts the same logits.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

FIX = Path(__file__).parent / "fixtures" / "published"
ZLAB = {  # fixture -> its target family
    "dflash-zlab-qwen3-bf16": "qwen3",
    "dflash-zlab-qwen3-fp16": "qwen3",
    "dflash-zlab-qwen3-fp32": "qwen3",
    "dflash-zlab-llama-bf16": "llama",
    "dflash-zlab-variants-fp32": "qwen3",
}
TOL = 1e-4


def ref(name: str) -> dict:
    with np.load(FIX / name / "reference.npz") as z:
        return {k: z[k].astype(np.float32) if z[k].dtype == np.float16 else z[k] for k in z.files}


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """family -> a make_tiny target of 6 layers whose embedding and LM head are the fixtures' tables."""
    from tiny import make_tiny
    from transformers import AutoModelForCausalLM

    out = {}
    for family, name in (("qwen3", "dflash-zlab-qwen3-bf16"), ("llama", "dflash-zlab-llama-bf16")):
        folder = make_tiny(family, tmp_path_factory.mktemp("pubdf") / family, num_hidden_layers=6)
        r = ref(name)
        model = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(torch.from_numpy(r["embed"]))
            if not model.config.tie_word_embeddings:
                model.lm_head.weight.copy_(torch.from_numpy(r["lm_head"]))
        model.save_pretrained(folder)
        out[family] = folder
    return out


def export_with(target: Path, drafter: Path, out: Path, validate: bool = False) -> Path:
    from edgespec.export.target.exporter import ExportConfig, export

    cfg = ExportConfig(
        target=str(target),
        dflash=str(drafter),
        eagle="none",
        medusa="none",
        out=str(out),
        max_len=128,
        k=3,
        prefill_chunk=16,
        kv_bucket=32,
        precision="fp32",
        validate=validate,
        progress=False,
    )
    return export(cfg)


_EXPORTS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def exported(targets, tmp_path_factory):
    """name -> its engine folder (exported once per module)."""

    def get(name: str, drafter: Path | None = None, family: str = "qwen3") -> Path:
        if name not in _EXPORTS:
            out = tmp_path_factory.mktemp("pubdf_eng") / name
            validate = name == "dflash-zlab-variants-fp32"  # edgespec's own graph-vs-PyTorch check, once
            _EXPORTS[name] = export_with(targets[ZLAB.get(name, family)], drafter or FIX / name, out, validate)
        return _EXPORTS[name]

    yield get
    _EXPORTS.clear()


def upstream_diff(folder: Path, r: dict) -> float:
    """max |drafter graph - z-lab's forward| over both recorded calls, on the graph's draft vocabulary."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.drafters.dflash.engine import OrtDFlash

    man = load_manifest(folder)
    engine = OrtDFlash(man, man.section("dflash"))
    hs = r["hidden_states"]  # HF's hidden_states[j] = the stream entering layer j: edgespec's aux j
    feats = np.concatenate([hs[j] for j in man.target.aux_layers], axis=-1)
    (c1, c2), toks = r["calls"], r["tokens"]
    got1 = engine.draft(feats[:c1], 0, int(toks[c1])).copy()
    got2 = engine.draft(feats[c1:c2], int(c1), int(toks[c2])).copy()
    d2t = engine.d2t
    return max(np.abs(got1 - r["logits1"][:, d2t]).max(), np.abs(got2 - r["logits2"][:, d2t]).max())


@pytest.mark.parametrize("name", list(ZLAB))
def test_exports_and_matches_zlab(exported, name):
    from edgespec.engines.manifest import load_manifest

    r = ref(name)
    folder = exported(name)
    man = load_manifest(folder)
    sec = man.section("dflash")
    # the target graphs output the streams z-lab's extract_context_feature reads (its own code picked them)
    want = tuple(sorted({int(r["zlab_reads"][i]) for i in r["zlab_target_layer_ids"]}))
    assert man.target.aux_layers == want
    assert list(r["zlab_reads"]) == [i + 1 for i in range(len(r["zlab_reads"]))]  # offset 1: a layer's output
    assert sec.block_size == int(r["block_size"]) and sec.mask_token_id == 255
    diff = upstream_diff(folder, r)
    assert diff < TOL, f"{name}: drafter graph vs z-lab's forward differ by {diff:.2e}"


@pytest.mark.parametrize("name", list(ZLAB))
def test_honoured_fields_change_the_output(name):
    """Each field the match relies on moves z-lab's logits far past the tolerance when left out
    (the drafter's own RoPE in every fixture; biases, scalings, repeated / unsorted ids in variants)."""
    r = ref(name)
    sens = {k.removeprefix("sensitivity_"): float(v) for k, v in r.items() if k.startswith("sensitivity_")}
    assert "rope" in sens
    if name == "dflash-zlab-variants-fp32":
        assert set(sens) == {
            "rope",
            "bias",
            "ids",
            "input_embedding_scale",
            "output_multiplier",
            "final_logit_softcapping",
        }
    assert min(sens.values()) > 1000 * TOL, sens


@pytest.mark.parametrize("name", ["dflash-zlab-qwen3-bf16", "dflash-zlab-llama-bf16", "dflash-zlab-variants-fp32"])
def test_speculative_greedy_equals_plain(exported, name):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    folder = exported(name)
    plain = Generator.load(folder, RuntimeConfig(drafter="none"))
    spec = Generator.load(folder, RuntimeConfig(drafter="dflash", k=3, eagle_min_confidence=0.0))
    rng = np.random.default_rng(4)
    drafted = 0
    for n in (5, 21):
        prompt = rng.integers(2, 256, n)
        want = np.concatenate(list(plain.generate_ids(prompt, 24)))
        got = np.concatenate(list(spec.generate_ids(prompt, 24)))
        assert np.array_equal(want, got), f"{name}: prompt of {n} differs from plain"
        drafted += spec.last_stats.n_drafted
    assert drafted > 0


def test_transformers4_rope_names_read_alike(tmp_path):
    """z-lab's releases name the RoPE as transformers 4 wrote it (rope_theta + rope_scaling)."""
    from edgespec.export.drafters.dflash.layout import read_layout

    src = FIX / "dflash-zlab-llama-bf16"
    cfg = json.loads((src / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    folder = tmp_path / "v4"
    folder.mkdir()
    shutil.copy(src / "model.safetensors", folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    a, b = read_layout(src).cfg, read_layout(folder).cfg
    assert a == b and a.rope_type == "llama3" and a.rope_theta == 500000.0


def _edited(tmp_path: Path, change, tensors=None) -> Path:
    """A copy of the bf16 Qwen3 fixture with config.json changed by `change` (dict -> None) and its
    tensors by `tensors` (dict of torch tensors -> None)."""
    from safetensors.torch import load_file, save_file

    src = FIX / "dflash-zlab-qwen3-bf16"
    folder = tmp_path / "bad"
    folder.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    w = load_file(str(src / "model.safetensors"))
    if tensors:
        tensors(w)
    save_file(w, str(folder / "model.safetensors"))
    return folder


def _set(path: str, value):
    def change(cfg):
        *outer, key = path.split(".")
        d = cfg
        for k in outer:
            d = d[k]
        if value is _DROP:
            d.pop(key)
        else:
            d[key] = value

    return change


_DROP = object()
REFUSED = {  # id -> (config change, tensor change, what the one-line refusal says)
    "dflash2": (_set("architectures", ["DFlash2DraftModel"]), None, "DFlash2DraftModel"),
    "not-dflash": (_set("architectures", ["LlamaForCausalLM"]), None, "not a DFlash drafter"),
    "no-block-size": (_set("block_size", _DROP), None, "names no block_size"),
    "block-size-twice": (_set("dflash_config.block_size", 8), None, "gives block_size twice"),
    "block-size-1": (_set("block_size", 1), None, "block_size 1"),
    "no-mask": (_set("dflash_config.mask_token_id", _DROP), None, "mask_token_id None"),
    "mask-outside-vocab": (_set("dflash_config.mask_token_id", 300), None, "mask_token_id 300"),
    "no-layer-ids": (
        lambda c: (c["dflash_config"].pop("target_layer_ids"), c.pop("num_target_layers")),
        None,
        "neither target_layer_ids nor num_target_layers",
    ),
    "last-layer": (_set("dflash_config.target_layer_ids", [1, 5]), None, "target layer id 5 is the target's last"),
    "layer-outside": (_set("dflash_config.target_layer_ids", [1, 9]), None, "target layer id 9 is outside"),
    "other-depth": (_set("num_target_layers", 8), None, "trained on a target of 8 layers"),
    "other-width": (_set("hidden_size", 128), None, "does not fit the target's hidden size 64"),
    "other-vocab": (_set("vocab_size", 512), None, "drafter vocab 512 != target vocab 256"),
    "sliding-layer": (_set("layer_types", ["full_attention", "sliding_attention"]), None, "not full_attention"),
    "sliding-window": (
        lambda c: c.update(use_sliding_window=True, sliding_window=8, max_window_layers=1, layer_types=None),
        None,
        "not full_attention",
    ),
    "causal": (_set("is_causal", True), None, "is_causal is true"),
    "gelu": (_set("hidden_act", "gelu"), None, "hidden_act 'gelu'"),
    "yarn": (_set("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), None, "'yarn'"),
    "partial-rotary": (_set("rope_parameters.partial_rotary_factor", 0.5), None, "partial_rotary_factor 0.5"),
    "unknown-draft-key": (_set("dflash_config.conv_kernel_size", 4), None, "dflash_config.conv_kernel_size"),
    "unknown-key": (_set("mlp_bias", True), None, "['mlp_bias']"),
    "own-lm-head": (None, lambda w: w.update({"lm_head.weight": torch.zeros(256, 64)}), "no embedding or LM head"),
    "missing-tensor": (None, lambda w: w.pop("layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj.weight"),
    "extra-tensor": (None, lambda w: w.update({"layers.0.attention_conv.base_kernel": torch.zeros(2)}), "not have"),
    "wrong-shape": (
        None,
        lambda w: w.update({"fc.weight": torch.zeros(64, 192)}),
        "fc.weight [64, 192] (config: [64, 128])",
    ),
    "bias-without-tensors": (_set("attention_bias", True), None, "q_proj.bias"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_the_target_loads(targets, tmp_path, case, target_never_loads):
    from edgespec.export.target.spec import ExportError

    change, tensors, says = REFUSED[case]
    folder = _edited(tmp_path, change or (lambda c: None), tensors)
    t0 = time.perf_counter()
    with pytest.raises(ExportError) as e:
        export_with(targets["qwen3"], folder, tmp_path / "eng")
    msg = str(e.value)
    assert says in msg and "\n" not in msg and msg.startswith("--dflash "), msg
    assert time.perf_counter() - t0 < 10


def test_cli_refuses_in_one_line(targets, tmp_path):
    """`edgespec export --dflash BAD`: one line on stderr, no traceback, seconds."""
    folder = _edited(tmp_path, _set("is_causal", True))
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "edgespec.cli", "export", "--target", str(targets["qwen3"]), "--max-len", "128"]
    p = subprocess.run([*cmd, "--dflash", str(folder), "--out", str(tmp_path / "eng")], capture_output=True, text=True)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0 and "Traceback" not in p.stderr and len(lines) == 1, p.stderr
    assert "is_causal is true" in lines[0]
    assert time.perf_counter() - t0 < 30  # an interpreter start and imports included (the check itself: < 10 s)


def test_zlab_folder_given_to_another_flag_is_taken_as_dflash():
    """Its plugin claims z-lab's folders (drafters.sources moves one given to another drafter's flag)."""
    from edgespec.export.drafters import registry

    assert registry()["dflash"].claims(FIX / "dflash-zlab-qwen3-bf16")
    assert not registry()["dflash"].claims(FIX / "dflash-zlab-publish")  # no config.json there


# ---- out: edgespec's drafter in z-lab's layout ------------------------------------------------------------
def test_publish_writes_what_zlab_loaded(exported, tmp_path):
    """The published copy of edgespec's drafter is the one z-lab's class loaded (same config and
    tensors), and exported back it drafts what z-lab's class computed; the edgespec original drafts
    the same logits on its draft vocabulary."""
    from safetensors.numpy import load_file

    from edgespec.export.drafters import registry
    from edgespec.export.drafters.dflash.layout import read_dflash

    src = FIX / "dflash-zlab-publish"
    out = registry()["dflash"].publish(src / "edgespec", "dflash-zlab", tmp_path / "zlab")
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "published_config.json").read_text())
    w = load_file(str(out / "model.safetensors"))
    _, original = read_dflash(src / "edgespec", 64, 256)
    assert set(w) == set(original) - {"d2t"} and all(w[k].dtype == np.float16 for k in w)
    assert all(np.array_equal(w[k].astype(np.float32), original[k]) for k in w)
    r = ref("dflash-zlab-publish")
    for name, drafter in (("published", out), ("edgespec", src / "edgespec")):
        diff = upstream_diff(exported(name, drafter), r)
        assert diff < TOL, f"{name}: drafter graph vs z-lab's forward of the published copy differ by {diff:.2e}"


def test_publish_keeps_a_zlab_checkpoint(tmp_path):
    """A z-lab checkpoint published again: bf16 kept, repeated / unsorted ids folded into fc (same reads)."""
    from edgespec.export.drafters import registry
    from edgespec.export.drafters.dflash.layout import read_dflash, read_layout

    plugin = registry()["dflash"]
    for name in ("dflash-zlab-qwen3-bf16", "dflash-zlab-variants-fp32"):
        out = plugin.publish(FIX / name, "dflash-zlab", tmp_path / name)
        a, b = read_layout(FIX / name), read_layout(out)
        assert b.dtype == a.dtype and b.cfg == a.cfg and b.stored_ids == a.cfg.target_layer_ids
        (_, x), (_, y) = read_dflash(FIX / name, 64, 256), read_dflash(out, 64, 256)
        assert all(np.allclose(x[k], y[k], atol=1e-2 if a.dtype == "BF16" else 0) for k in x)


def test_publish_refuses_an_existing_folder(tmp_path):
    from edgespec.export.drafters import registry
    from edgespec.export.target.spec import ExportError

    with pytest.raises(ExportError, match="already exists"):
        registry()["dflash"].publish(FIX / "dflash-zlab-qwen3-bf16", "dflash-zlab", tmp_path)
