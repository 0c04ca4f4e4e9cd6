"""Published EAGLE-1/2 heads (SafeAILab/EAGLE's layout) in and out of the `eagle` drafter.

The fixtures (tests/fixtures/published/eagle1-official*/{fp32,fp16,bf16}/) are written by the
upstream repo's own model class and save code (tools/published_fixtures/eagle1.py; upstream.json
names the commit), each with reference.npz: that class's forward on fixed inputs, in fp32.
  eagle1-official        Llama shape, no fc bias, rope_theta 500000 (the tiny target's: 10000)
  eagle1-official-qwen2  Qwen2 shape, fc and q/k/v biases, rope_theta 1e6, rms_norm_eps 1e-6
Each exports with a tiny target of its family given the folder and nothing else (`--eagle DIR`), its
head graph matches the upstream forward, greedy decoding with it is plain greedy decoding; every
config variant is honoured (linear RoPE scaling, against the upstream forward) or refused with the
reason before the target loads; `export-drafter --format eagle1-official` writes it back tensor for
tensor, and refuses what the layout cannot carry (the shipped head's norms and draft vocabulary).
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgespec.cli import main  # noqa: E402
from edgespec.export.drafters.eagle.checkpoint import read_head, save_head  # noqa: E402
from edgespec.export.drafters.eagle.head import build_head  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "published"
FAMILY = {"eagle1-official": "llama", "eagle1-official-qwen2": "qwen2"}
DTYPES = ("fp32", "fp16", "bf16")
CASES = [pytest.param(layout, dtype, id=f"{layout}-{dtype}") for layout in FAMILY for dtype in DTYPES]
EXPORT = ["--max-len", "256", "--k", "4", "--prefill-chunk", "16", "--kv-bucket", "32", "--precision", "fp32"]
WIDTHS = (5, 4, 2, 1)  # the reference's 12 rows fed as verify, verify, verify and decode calls on the head's KV


def _fixture(layout: str, dtype: str) -> Path:
    return FIXTURES / layout / dtype


def _reference(layout: str, dtype: str) -> dict[str, np.ndarray]:
    return dict(np.load(_fixture(layout, dtype) / "reference.npz"))


def _target_tables(target: Path) -> tuple:
    """(embedding [V, H], LM head [V, H], arch) of a tiny target."""
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    from edgespec.export.target.arch import arch_from_config

    w = load_file(str(target / "model.safetensors"))
    embed = w["model.embed_tokens.weight"].astype(np.float32)
    arch = arch_from_config(AutoConfig.from_pretrained(target), 256)
    return embed, w.get("lm_head.weight", embed).astype(np.float32), arch


def _export(target: Path, head: Path, out: Path, *extra: str) -> tuple[int, str]:
    """`edgespec export --target T --eagle HEAD` (the user's command); (exit status, stderr)."""
    from contextlib import redirect_stderr
    from io import StringIO

    err = StringIO()
    with redirect_stderr(err):
        rc = main(["export", "--target", str(target), "--eagle", str(head), "--out", str(out), *EXPORT, *extra])
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def engines(tiny_models, tmp_path_factory):
    """(layout, dtype) -> its fixture exported with the tiny target of its family (made once, on demand)."""
    root, made = tmp_path_factory.mktemp("published_eagle1"), {}

    def get(layout: str, dtype: str) -> Path:
        if (layout, dtype) not in made:
            out = root / f"{layout}-{dtype}"
            rc, err = _export(tiny_models[FAMILY[layout]], _fixture(layout, dtype), out)
            assert rc == 0, err
            made[layout, dtype] = out
        return made[layout, dtype]

    return get


def _head_logits(engine: Path, ids: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """The exported head graph's logits on rows (ids [T], feats [T, H]), fed in WIDTHS calls on its own KV."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    man = load_manifest(engine)
    head = OrtModel(man, man.models()["eagle"])
    assert set(WIDTHS) <= set(man.models()["eagle"].widths())
    out, past = [], 0
    for w in WIDTHS:
        out.append(head.forward(ids[past : past + w], past, features=feats[past : past + w]).copy())
        head.commit(past, w)
        past += w
    return np.concatenate(out)


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_head_graph_matches_the_upstream_forward(engines, tiny_models, layout, dtype):
    """Exported from the folder alone, the head graph's logits are the upstream class's (< 1e-4): its
    own RoPE (not the target's), its biases, its RMSNorm eps (not the target's). fp16/bf16: the
    upstream class embeds with its own rounded copy of the embedding, edgespec with the target's
    table (the fixture's copy is the tiny target's, rounded: else the fixtures need regenerating)."""
    ref = _reference(layout, dtype)
    embed, _, _ = _target_tables(tiny_models[FAMILY[layout]])
    copy = torch.load(_fixture(layout, dtype) / "pytorch_model.bin")["embed_tokens.weight"].float().numpy()
    assert np.abs(copy - embed).max() <= 2**-7 * np.abs(embed).max(), "regenerate: tools/published_fixtures/eagle1.py"
    got = _head_logits(engines(layout, dtype), ref["input_ids"][0], ref["hidden_states"][0])
    diff = np.abs(got - ref["logits"][0]).max()
    assert diff < 1e-4, f"{layout} {dtype}: max |graph - upstream| logits {diff:.3g}"
    # fp32: the same weights, so tighter; the Llama head's eps 1e-5 is not its target's 1e-6 (a graph on
    # the target's eps was 7.6e-6 off)
    assert dtype != "fp32" or diff < 2e-6, f"{layout}: max |graph - upstream| logits {diff:.3g}"
    # the same rows in one call vs two on the upstream side's cache agree: the graph's calls above are split too
    assert np.abs(ref["out_hidden_cached"] - ref["out_hidden"]).max() < 1e-5


def _forward(head, ref) -> tuple:
    """(features [n, H] as a tensor, logits [n, V]) of edgespec's PyTorch head on the reference's rows, one step."""
    n = ref["input_ids"].shape[1]
    rows = (torch.from_numpy(ref["input_ids"]), torch.from_numpy(ref["hidden_states"]), torch.arange(n)[None])
    with torch.no_grad():
        feat = head(*rows, torch.ones(1, n, dtype=torch.bool), n_steps=1)[0]
        return feat, head.logits(feat).numpy()


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_pytorch_head_matches_the_upstream_forward(tiny_models, layout, dtype):
    """edgespec's PyTorch head (what validation and training use) on the read checkpoint, whatever its
    dtype: the upstream features (fp32: to 1e-5) and logits (< 1e-4)."""
    ref = _reference(layout, dtype)
    embed, lm_head, arch = _target_tables(tiny_models[FAMILY[layout]])
    hc, arrays = read_head(_fixture(layout, dtype), arch.hidden_size, arch.vocab_size)
    assert (hc.qkv_bias, hc.fc_bias) == ((True, True) if layout.endswith("qwen2") else (False, False))
    assert hc.rope_theta == (1e6 if layout.endswith("qwen2") else 5e5) != arch.rope_theta
    cos, sin = arch.rope_tables()
    head = build_head(hc, arrays, embed, lm_head, cos, sin)
    feat, logits = _forward(head, ref)
    assert np.abs(logits - ref["logits"]).max() < 1e-4
    if dtype == "fp32":
        assert np.abs(feat.numpy() - ref["out_hidden"]).max() < 1e-5


@pytest.mark.parametrize("layout", FAMILY)
def test_speculative_greedy_output_is_plain_greedy_output(engines, layout):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(engines(layout, "bf16"), RuntimeConfig(drafter="none", adaptive=False, eagle_min_confidence=0.0))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 250, n) for n in (7, 30)] + [np.array([40, 41, 42, 40, 41, 42, 40, 41])]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 40)]) for p in prompts]
    for k in (1, 4):
        g.set_drafter("eagle", k)
        for p, ref in zip(prompts, plain, strict=True):
            assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(p, 40)]), ref), (layout, k, p)
        assert g.last_stats.n_drafted > 0


def test_safetensors_and_bin_read_alike(tmp_path):
    """The same head as model.safetensors (bf16, read without numpy's bfloat16) reads to the same arrays."""
    from safetensors.torch import save_file

    src = _fixture("eagle1-official-qwen2", "bf16")
    folder = tmp_path / "st"
    folder.mkdir()
    shutil.copy(src / "config.json", folder)
    save_file(torch.load(src / "pytorch_model.bin"), str(folder / "model.safetensors"))
    hc_bin, bin_arrays = read_head(src, 64, 256)
    hc_st, st_arrays = read_head(folder, 64, 256)
    assert hc_bin == hc_st and bin_arrays.keys() == st_arrays.keys()
    assert all(np.array_equal(bin_arrays[k], st_arrays[k]) for k in bin_arrays)


def test_linear_rope_scaling_is_honoured(tiny_models, tmp_path):
    """rope_scaling {type: linear, factor: 2} (base 10000, as the upstream code computes): the head
    graph's logits are the upstream forward's under that config."""
    folder = tmp_path / "linear2"
    shutil.copytree(_fixture("eagle1-official", "fp32"), folder)
    config = json.loads((folder / "config.json").read_text())
    del config["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config | {"rope_scaling": {"type": "linear", "factor": 2.0}}))
    ref = _reference("eagle1-official", "fp32")
    _, lm_head, _ = _target_tables(tiny_models["llama"])
    want = ref["out_hidden_linear2"][0] @ lm_head.T
    rc, err = _export(tiny_models["llama"], folder, tmp_path / "engine")
    assert rc == 0, err
    got = _head_logits(tmp_path / "engine", ref["input_ids"][0], ref["hidden_states"][0])
    assert np.abs(got - want).max() < 1e-4
    assert np.abs(got - ref["logits"][0]).max() > 1e-2  # the scaling changes the head's output


def _mutated(tmp_path: Path, layout: str, config=None, tensors=None) -> Path:
    """A copy of a fp32 fixture with config.json updated (None values delete keys) and tensors edited."""
    src = _fixture(layout, "fp32")
    folder = tmp_path / "bad"
    folder.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    for k, v in (config or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))
    state = torch.load(src / "pytorch_model.bin")
    if tensors:
        tensors(state)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def _set(name, shape):
    return lambda s: s.__setitem__(name, torch.zeros(shape))


def _drop(name):
    return lambda s: s.pop(name)


# (layout, config changes, tensor edit, what the one-line refusal says)
REFUSED = {
    "dynamic-rope": ("eagle1-official", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, None, "dynamic NTK"),
    "hf-rope-form": (
        "eagle1-official",
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        None,
        r"has no `type`: the official EAGLE code reads rope_scaling\['type'\]",
    ),
    "linear-rope-with-theta": (
        "eagle1-official",
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        None,
        "ignores rope_theta",
    ),
    "qkv-bias-undeclared": ("eagle1-official-qwen2", {"qkv_bias": None}, None, "has no `qkv_bias: true`"),
    "qkv-bias-missing": (
        "eagle1-official",
        {"qkv_bias": True},
        None,
        r"missing tensors \['layers.0.self_attn.k_proj.bias'",
    ),
    "o-proj-bias": ("eagle1-official", {}, _set("layers.0.self_attn.o_proj.bias", 64), "no o_proj bias"),
    "fc-bias-undeclared": ("eagle1-official", {}, _set("fc.bias", 64), "says `bias: false`"),
    "fc-bias-missing": (
        "eagle1-official-qwen2",
        {},
        _drop("fc.bias"),
        r"missing tensors \['fc.bias'\] \(config.json: bias",
    ),
    "two-layers": ("eagle1-official", {"num_hidden_layers": 2}, None, "num_hidden_layers 2"),
    "layers-undeclared": ("eagle1-official", {"num_hidden_layers": None}, None, r"lacks \['num_hidden_layers'\]"),
    "second-layer": ("eagle1-official", {}, _set("layers.1.mlp.up_proj.weight", (128, 64)), "a second decoder layer"),
    "head-dim": ("eagle1-official", {"head_dim": 32}, None, "hidden_size / heads wide"),
    "gelu": ("eagle1-official", {"hidden_act": "gelu"}, None, "SiLU MLPs only"),
    "attention-bias": ("eagle1-official", {"attention_bias": True}, None, "attention_bias: true, which the official"),
    "sliding": ("eagle1-official-qwen2", {"use_sliding_window": True}, None, "use_sliding_window: true"),
    "unknown-key": ("eagle1-official", {"logit_scale": 2.0}, None, "`logit_scale` .* does not know"),
    "own-lm-head": ("eagle1-official", {}, _set("lm_head.weight", (256, 64)), "an LM head of its own"),
    "vocab": ("eagle1-official", {"vocab_size": 300}, None, "head vocab 300 != target vocab 256"),
    "kv-heads": ("eagle1-official", {"num_key_value_heads": 4}, None, r"k_proj.weight is \[32, 64\] float32, expected"),
    "draft-vocab-cut": ("eagle1-official", {}, None, "not in frequency order"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_folder_is_refused_before_the_target_loads(tiny_models, tmp_path, case, target_never_loads):
    """One line naming the reason, exit status 2, no traceback, in seconds: the target never loads."""
    layout, config, tensors, reason = REFUSED[case]
    folder = _mutated(tmp_path, layout, config, tensors)
    extra = ["--eagle-draft-vocab", "100"] if case == "draft-vocab-cut" else []
    t0 = time.perf_counter()
    rc, err = _export(tiny_models[FAMILY[layout]], folder, tmp_path / "engine", *extra)
    assert rc == 2 and time.perf_counter() - t0 < 10
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgespec export: error: --eagle {folder}"), err
    import re

    assert re.search(reason, lines[0]), lines[0]
    assert not (tmp_path / "engine").exists()


@pytest.mark.parametrize(
    ("config", "tensors", "reason"),
    [
        ({}, _set("midlayer.hidden_norm.weight", 64), "an EAGLE-3 checkpoint .* Hint: .*--eagle3-head"),
        (
            {"speculators_config": {}},
            None,
            "a vLLM speculators checkpoint, not an EAGLE-1/2 head. Hint: pass it to --eagle3-head",
        ),
        ({"medusa_num_heads": 3}, None, "a Medusa checkpoint, not an EAGLE-1/2 head. Hint: pass it to --medusa"),
    ],
    ids=["eagle3", "speculators", "medusa"],
)
def test_another_drafters_checkpoint_names_its_flag(tmp_path, config, tensors, reason):
    """Read as an EAGLE-1 head (which flag takes such a folder first is the registry's `claims`)."""
    from edgespec.export.drafters.eagle.checkpoint import inspect_head
    from edgespec.export.train.checkpoint import HeadFormatError

    with pytest.raises(HeadFormatError, match=reason):
        inspect_head(_mutated(tmp_path, "eagle1-official", config, tensors), 64, 256)


def test_unreadable_weights_are_refused_before_the_target_loads(tiny_models, tmp_path, monkeypatch):
    from edgespec.export.target import sources

    monkeypatch.setattr(sources, "load", lambda *a, **k: pytest.fail("the target loaded"))
    folder = _mutated(tmp_path, "eagle1-official")
    (folder / "pytorch_model.bin").unlink()
    rc, err = _export(tiny_models["llama"], folder, tmp_path / "e1")
    assert rc == 2 and "no weights file (looked for model.safetensors" in err and len(err.strip().splitlines()) == 1
    (folder / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    rc, err = _export(tiny_models["llama"], folder, tmp_path / "e2")
    assert rc == 2 and "cannot be read as a PyTorch state dict" in err and len(err.strip().splitlines()) == 1


def test_a_head_for_another_target_is_refused(tiny_models, tmp_path, monkeypatch):
    """Another hidden size: before the target loads; another embedding (the one the official loader
    would use): at the head's step, named."""
    from tiny import make_tiny

    wide = make_tiny("llama", tmp_path / "wide", hidden_size=96)
    rc, err = _export(wide, _fixture("eagle1-official", "fp16"), tmp_path / "e1")
    assert rc == 2 and "head hidden size 64 does not fit the target's hidden size 96" in err
    other = make_tiny("llama", tmp_path / "other", seed=3)
    rc, err = _export(other, _fixture("eagle1-official", "fp16"), tmp_path / "e2")
    assert rc == 2 and "embed_tokens.weight (the embedding the head was trained on) differs from the target's" in err


# ---- out: export-drafter --format eagle1-official ----------------------------------------------------
def _publish(folder: Path, out: Path) -> tuple[int, str]:
    from contextlib import redirect_stderr
    from io import StringIO

    err = StringIO()
    with redirect_stderr(err):
        rc = main(["export-drafter", str(folder), "--format", "eagle1-official", "--out", str(out)])
    return rc, err.getvalue()


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_publish_writes_the_official_layout_back(tmp_path, layout, dtype):
    """Tensor for tensor in the stored dtype (no embed_tokens: the official loader takes the target's),
    the config fields its code reads unchanged; read back, the same head."""
    src = _fixture(layout, dtype)
    rc, err = _publish(src, tmp_path / "out")
    assert rc == 0, err
    want = torch.load(src / "pytorch_model.bin")
    got = torch.load(tmp_path / "out" / "pytorch_model.bin")
    assert set(got) == set(want) - {"embed_tokens.weight"}
    for k, v in got.items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    a, b = (json.loads((f / "config.json").read_text()) for f in (src, tmp_path / "out"))
    read = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps")
    assert all(a[k] == b[k] for k in read + ("rope_theta", "bias", "torch_dtype", "architectures"))
    assert b.get("qkv_bias", False) == a.get("qkv_bias", False) and b["num_hidden_layers"] == 1
    hc, arrays = read_head(src, 64, 256)
    hc2, arrays2 = read_head(tmp_path / "out", 64, 256)
    assert hc == hc2 and all(np.array_equal(arrays[k], arrays2[k]) for k in arrays)


@pytest.mark.parametrize("layout", FAMILY)
def test_edgespec_layout_round_trip(engines, tiny_models, tmp_path, layout):
    """official fp16 -> edgespec's layout (save_head) -> export-drafter -> the same official tensors;
    the re-published head exports to the same head graph and drafts the same: identical greedy
    output and acceptance."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    src = _fixture(layout, "fp16")
    embed, lm_head, arch = _target_tables(tiny_models[FAMILY[layout]])
    hc, arrays = read_head(src, arch.hidden_size, arch.vocab_size)
    cos, sin = arch.rope_tables()
    save_head(build_head(hc, arrays, embed, lm_head, cos, sin), tmp_path / "edgespec")
    assert read_head(tmp_path / "edgespec", 64, 256)[0] == hc
    rc, err = _publish(tmp_path / "edgespec", tmp_path / "official")
    assert rc == 0, err
    want, got = (torch.load(f / "pytorch_model.bin") for f in (src, tmp_path / "official"))
    assert all(torch.equal(v, want[k]) for k, v in got.items()) and len(got) == len(want) - 1
    rc, err = _export(tiny_models[FAMILY[layout]], tmp_path / "official", tmp_path / "engine")
    assert rc == 0, err
    assert (tmp_path / "engine" / "eagle.weights").read_bytes() == (
        engines(layout, "fp16") / "eagle.weights"
    ).read_bytes()
    runs = []
    for engine in (engines(layout, "fp16"), tmp_path / "engine"):
        g = Generator.load(engine, RuntimeConfig(drafter="eagle", k=4, adaptive=False, eagle_min_confidence=0.0))
        out = [np.concatenate([x.copy() for x in g.generate_ids(np.arange(30 + i, 50 + i), 40)]) for i in range(3)]
        runs.append((out, g.last_stats.n_drafted, g.last_stats.n_accepted))
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][0], runs[1][0], strict=True)) and runs[0][1:] == runs[1][1:]


def test_publish_refuses_what_the_layout_cannot_carry(tmp_path):
    """The shipped head: its layer-0 input norm, its output norm, its 8192-token draft vocabulary and
    its unrecorded RoPE, all named in one line; nothing written."""
    shipped = ROOT / "export" / "heads" / "smollm2-135m-instruct"
    rc, err = _publish(shipped, tmp_path / "out")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    for part in (
        "the eagle1-official layout cannot carry layers.0.input_layernorm",
        "norm.weight (an output norm; the official class has none)",
        "a draft vocabulary of 8192 of 49152 tokens",
        "config.json has no rope_theta",
    ):
        assert part in err, (part, err)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.skipif(
    not os.environ.get("EDGESPEC_EAGLE_UPSTREAM"),
    reason="EDGESPEC_EAGLE_UPSTREAM='PYTHON EAGLE_SRC' (a Python with transformers 4.53 and a SafeAILab/EAGLE "
    "checkout) loads the published head with the upstream class",
)
def test_the_upstream_class_loads_what_publish_wrote(tiny_models, tmp_path):
    """An edgespec head (fixture weights moved off the fixture's) -> export-drafter -> the upstream
    loader (EaModel's way: EConfig, bias, load_state_dict strict=False with nothing skipped) -> the
    logits of edgespec's PyTorch head, < 1e-4."""
    python, src = os.environ["EDGESPEC_EAGLE_UPSTREAM"].split()
    for layout in FAMILY:
        embed, lm_head, arch = _target_tables(tiny_models[FAMILY[layout]])
        hc, arrays = read_head(_fixture(layout, "fp16"), 64, 256)
        rng = np.random.default_rng(9)
        arrays = {
            k: v if k == "d2t" else (v + rng.normal(0, 0.01, v.shape)).astype(np.float32) for k, v in arrays.items()
        }
        cos, sin = arch.rope_tables()
        save_head(build_head(hc, arrays, embed, lm_head, cos, sin), tmp_path / layout / "edgespec")
        hc, arrays = read_head(tmp_path / layout / "edgespec", 64, 256)  # as stored (fp16)
        head = build_head(hc, arrays, embed, lm_head, cos, sin)
        ref = _reference(layout, "fp16")
        mine = tmp_path / layout / "edgespec.npz"
        np.savez(mine, input_ids=ref["input_ids"], hidden_states=ref["hidden_states"], logits=_forward(head, ref)[1])
        assert _publish(tmp_path / layout / "edgespec", tmp_path / layout / "official")[0] == 0
        script = ROOT / "tools" / "published_fixtures" / "eagle1.py"
        check = [str(tmp_path / layout / "official"), FAMILY[layout], str(mine)]
        res = subprocess.run(
            [python, str(script), "--eagle-src", src, "--edgespec-python", sys.executable, "--check", *check],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        diff = float(res.stdout.strip().rsplit("=", 1)[1])
        assert diff < 1e-4, (layout, diff)


def test_the_rope_base_as_stated_or_overridden(engines, tiny_models, tmp_path):
    """eagle1-official states rope_theta 500000, which the EAGLE GitHub code applies and eagle-llm 1.2.1
    (PyPI) ignores (10000): exported as stated by default, the export says so with the way out;
    --eagle-rope-theta 10000 gives the head graph a PyTorch head on base 10000 computes, and the
    manifest records the base and where it came from."""
    import dataclasses

    from edgespec.engines.manifest import load_manifest

    layout, target = "eagle1-official", tiny_models["llama"]
    ref = _reference(layout, "fp32")
    stated = load_manifest(engines(layout, "fp32")).models()["eagle"].head
    assert (stated.rope_theta, stated.rope_theta_from) == (500000.0, "its config.json")
    rc, err = _export(target, _fixture(layout, "fp32"), tmp_path / "e", "--eagle-rope-theta", "10000")
    assert rc == 0, err
    assert "RoPE base 10000, from --eagle-rope-theta (its config.json: 500000)" in err
    head = load_manifest(tmp_path / "e").models()["eagle"].head
    assert head.rope_theta == 10000.0 and head.rope_theta_from.startswith("--eagle-rope-theta")
    embed, lm_head, arch = _target_tables(target)
    hc, arrays = read_head(_fixture(layout, "fp32"), arch.hidden_size, arch.vocab_size)
    cos, sin = arch.rope_tables()
    _, want = _forward(build_head(dataclasses.replace(hc, rope_theta=10000.0), arrays, embed, lm_head, cos, sin), ref)
    got = _head_logits(tmp_path / "e", ref["input_ids"][0], ref["hidden_states"][0])
    assert np.abs(got - want[0]).max() < 1e-4
    assert np.abs(got - ref["logits"][0]).max() > 1e-2  # not the head on base 500000
    rc, err = _export(target, _fixture(layout, "fp32"), tmp_path / "bad", "--eagle-rope-theta", "0")
    assert rc == 2 and "--eagle-rope-theta must be a finite RoPE base > 1" in err


def test_the_stated_base_of_an_official_head_is_said_before_the_target_loads(tiny_models, capsys):
    """Where the upstreams disagree (an official head stating a base other than 10000), the preflight
    says which base the export uses and how to get eagle-llm's."""
    from edgespec.export.drafters import registry
    from edgespec.export.target import sources
    from edgespec.export.target.spec import ExportConfig

    target = tiny_models["llama"]
    shape = sources.target_shape(sources.resolve(str(target)))
    plugin, cfg = registry()["eagle"], ExportConfig(target=str(target))
    plugin.preflight(cfg, _fixture("eagle1-official", "fp32"), shape)
    err = capsys.readouterr().err
    assert "RoPE base 500000, from its config.json; eagle-llm 1.2.1 from PyPI trains with 10000" in err, err
    assert "pass --eagle-rope-theta 10000" in err and len(err.strip().splitlines()) == 1
