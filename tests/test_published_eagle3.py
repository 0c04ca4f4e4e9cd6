"""Published EAGLE-3 heads (tests/fixtures/published/eagle3-*, written by the official EAGLE code,
SpecForge and vLLM speculators themselves: tools/published_fixtures/eagle3.py): each exports through
--eagle3-head given the folder alone, its head graph computes what the project's own forward
computed (fp32, < 1e-4, draft steps 1-3), speculative greedy output is plain greedy output, every
variant is honoured or refused with its reason, bad folders are refused before the target loads,
and `edgespec export-drafter` writes heads the upstream loaders read to the same logits."""

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

FIXTURES = Path(__file__).parent / "fixtures" / "published"
N_ROWS = 12  # rows whose chains the references hold
# layout id -> (fixture folder, what the head must have been read as: Eagle3Config fields)
CASES = {
    "eagle3-official": ("eagle3-official", dict(layout="eagle3-official", own_embed=False, rope_theta=10000.0)),
    "eagle3-specforge-bf16": ("eagle3-specforge", dict(layout="eagle3-specforge", own_embed=True, fc_norm="none")),
    "eagle3-specforge-variants-bf16": (
        "eagle3-specforge-variants",
        # fc_norm, norm_output false, target_hidden_size 64 into a 32-wide head, llama3 RoPE of theta 500000
        dict(
            fc_norm="per_layer",
            logits_norm=False,
            hidden_size=32,
            target_hidden_size=64,
            rope_type="llama3",
            rope_theta=500000.0,
            own_embed=True,
        ),
    ),
    "eagle3-speculators-bf16": ("eagle3-speculators", dict(layout="eagle3-speculators", fc_norm="none")),
    "eagle3-speculators-variants-bf16": (
        "eagle3-speculators-variants",
        # norm_before_residual, norm_before_fc, norm_output (fed back normed), linear RoPE of theta 20000
        dict(norm_before_residual=True, fc_norm="whole", feed_normed=True, rope_type="linear", rope_theta=20000.0),
    ),
    "eagle3-speculators-fcnorm-bf16": ("eagle3-speculators-fcnorm", dict(fc_norm="per_layer")),
}
EXPORT_FLAGS = ["--eagle", "none", "--medusa", "none", "--max-len", "128", "--k", "4", "--prefill-chunk", "16",
                "--kv-bucket", "32", "--precision", "fp32", "--no-trees"]  # fmt: skip


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny 8-layer llama (aux layers 2, 4, 5) whose embedding is the table the references used
    where a head has none of its own."""
    from tiny import make_tiny
    from transformers import AutoModelForCausalLM

    folder = make_tiny("llama", tmp_path_factory.mktemp("e3pub") / "llama8", num_hidden_layers=8)
    model = AutoModelForCausalLM.from_pretrained(folder)
    embed = np.load(FIXTURES / "eagle3-official" / "reference.npz")["embed"]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.from_numpy(embed))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def engines(target, tmp_path_factory):
    """layout id -> the engine folder `edgespec export --eagle3-head FIXTURE` wrote (exported once)."""
    from edgespec.cli import main

    root, made = tmp_path_factory.mktemp("e3pub_engines"), {}

    def get(case: str) -> Path:
        if case not in made:
            out = root / case
            flag = "--eagle" if case == "eagle3-official" else "--eagle3-head"  # --eagle: claimed by eagle3
            head = FIXTURES / CASES[case][0]
            flags = EXPORT_FLAGS[2:] if flag == "--eagle" else EXPORT_FLAGS  # EXPORT_FLAGS[:2]: --eagle none
            assert main(["export", "--target", str(target), flag, str(head), "--out", str(out), *flags]) == 0
            made[case] = out
        return made[case]

    return get


def _head_chains(engine_folder: Path, ref) -> list[np.ndarray]:
    """Draft steps 1-3 from each row j < N_ROWS, run by the head graph as the runtime runs it: row j
    fed fc(aux_j) (the runtime's norm and projection), then two steps fed the graph's own hidden output."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.drafters.eagle3 import normed_aux

    m = load_manifest(engine_folder)
    sec = m.section("eagle3")
    engine = OrtModel(m, sec.head)
    fc_t = np.fromfile(engine_folder / sec.fc.file, np.float32, count=int(np.prod(sec.fc.shape)), offset=sec.fc.offset)
    aux, tokens = ref["aux"], ref["tokens"]
    normed = np.zeros_like(aux)
    normed_aux(aux, normed, sec.fc_norm, len(sec.head.aux_layers), sec.fc_norm_eps)
    g = normed @ fc_t.reshape(sec.fc.shape)  # [N, H]
    steps = [[], [], []]
    for j in range(N_ROWS):
        feat = g[j : j + 1]
        for s in range(3):
            logits = engine.forward(tokens[j + s : j + s + 1], j + s, features=feat)
            engine.commit(j + s, 1)  # step 1's row is the true row j; the chain's rows are overwritten later
            steps[s].append(logits[0].copy())
            feat = engine.last_hidden(1).copy()
    return [np.array(s) for s in steps]


@pytest.mark.parametrize("case", list(CASES))
def test_export_matches_upstream_and_is_lossless(case, engines):
    """Exported through the user-facing flag from the folder alone; the graph's logits at draft steps
    1-3 are the project's own forward's; drafting with it leaves greedy output unchanged."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.export.drafters.eagle3.layouts import detect
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    folder, want = CASES[case]
    assert detect(FIXTURES / folder) == want.get("layout", detect(FIXTURES / folder))
    out = engines(case)
    m = load_manifest(out)
    assert m.target.aux_layers == m.models()["eagle3"].aux_layers == (2, 4, 5)
    assert max(m.models()["eagle3"].validation.values()) < 1e-4
    ref = np.load(FIXTURES / folder / "reference.npz")
    for s, got in enumerate(_head_chains(out, ref)):
        diff = float(np.abs(got - ref[f"logits_s{s + 1}"]).max())
        assert diff < 1e-4, (case, s + 1, diff)
    g = Generator.load(out, RuntimeConfig(drafter="none", adaptive=False, eagle_min_confidence=0.0))
    prompts = [np.arange(40, 70), np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 24)]) for p in prompts]
    g.set_drafter("eagle3", 3)
    for p, ref_out in zip(prompts, plain, strict=True):
        assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(p, 24)]), ref_out), case
    assert g.last_stats.n_drafted > 0


@pytest.mark.parametrize("case", list(CASES))
def test_variants_are_read_as_the_project_means_them(case):
    from edgespec.export.drafters.eagle3.head import read_eagle3

    folder, want = CASES[case]
    ec, arrays, _ = read_eagle3(FIXTURES / folder, 64, 256, 8)
    assert ec.aux_layers == (2, 4, 5)  # SpecForge's [1, 3, 4] are SGLang's layer outputs: entering 2, 4, 5
    for key, value in want.items():
        assert getattr(ec, key) == value, (case, key)
    assert ("embed_tokens.weight" in arrays) == ec.own_embed


def test_the_heads_own_rope_not_the_targets():
    """A head trained with theta 500000 + llama3 scaling (on a theta-10000 target here) keeps its own
    tables: the step 2-3 parity above could not pass on the target's."""
    import dataclasses

    from edgespec.export.drafters.eagle3.head import read_eagle3, rope_tables

    ec, _, _ = read_eagle3(FIXTURES / "eagle3-specforge-variants", 64, 256, 8)
    assert (ec.rope_theta, ec.rope_type) == (500000.0, "llama3")
    target_like = dataclasses.replace(ec, rope_theta=10000.0, rope_type="default", rope_params=())
    assert not np.allclose(rope_tables(ec, 128)[0], rope_tables(target_like, 128)[0])


# ---- refusals: one line, the reason, before the target loads ------------------------------------------------
def _copy(src: str, tmp_path: Path, edit=None, weights=None) -> Path:
    out = tmp_path / src
    shutil.copytree(FIXTURES / src, out)
    if edit is not None:
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    if weights is not None:
        from safetensors.torch import load_file, save_file

        save_file(weights(load_file(str(out / "model.safetensors"))), str(out / "model.safetensors"))
    return out


def _set(path: str, value):
    def edit(cfg):
        *keys, last = path.split(".")
        d = cfg
        for k in keys:
            d = d.setdefault(k, {})
        d[last] = value

    return edit


def _sliding(cfg, window: int) -> None:
    """speculators 0.9's trainer default: its draft layers marked sliding_attention with a window."""
    cfg["transformer_layer_config"] |= dict(
        layer_types=["sliding_attention"], sliding_window=window, use_sliding_window=True
    )


REFUSED = [
    ("eagle3-official", _set("rope_scaling", {"type": "dynamic", "factor": 2.0}), "'dynamic'"),
    ("eagle3-official", _set("eagle_config.eagle_aux_hidden_state_layer_ids", [1, 3, 4]), "never reads"),
    ("eagle3-specforge", _set("num_hidden_layers", 2), "one decoder layer"),
    ("eagle3-specforge", _set("attention_bias", True), "no biases"),
    ("eagle3-specforge", _set("hidden_act", "gelu"), "SwiGLU"),
    ("eagle3-specforge", _set("some_new_switch", True), "some_new_switch, which edgespec's EAGLE-3 reader does not"),
    ("eagle3-specforge", _set("rope_scaling", {"rope_type": "yarn", "factor": 4.0}), "RoPE type 'yarn'"),
    ("eagle3-specforge", _set("eagle_config.use_aux_hidden_state", False), "last hidden state"),
    ("eagle3-specforge-variants", _set("fc_norm", False), "an fc norm the config does not turn on"),
    ("eagle3-speculators", _set("transformer_layer_config.model_type", "qwen3"), "'qwen3' decoder layer"),
    ("eagle3-speculators", _set("norm_before_fc", True), "lack input_norm.weight"),
    ("eagle3-speculators-fcnorm", _set("norm_before_fc", True), "both set"),
    ("eagle3-speculators", _set("eagle_aux_hidden_state_layer_ids", [2, 4, 9]), "outside this 8-layer target"),
    ("eagle3-speculators", _set("eagle_aux_hidden_state_layer_ids", [2, 4, 8]), "not available as an aux layer"),
    ("eagle3-speculators", _set("eagle_aux_hidden_state_layer_ids", [2, 4]), "names 2 target layers"),
    ("eagle3-speculators", _set("draft_vocab_size", 64), "lm_head.weight is BF16 [48, 64], the config says"),
    ("eagle3-speculators", lambda c: _sliding(c, 64), "sliding_window=64, smaller than --max-len 128"),
]


@pytest.mark.parametrize("src, edit, why", REFUSED, ids=[f"{s}-{w[:24]}" for s, _, w in REFUSED])
def test_refused_with_the_reason_before_the_target_loads(src, edit, why, target, tmp_path, capsys, target_never_loads):
    from edgespec.cli import main

    head = _copy(src, tmp_path, edit)
    t0 = time.perf_counter()
    rc = main(
        ["export", "--target", str(target), "--eagle3-head", str(head), "--out", str(tmp_path / "o"), *EXPORT_FLAGS]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert why in err[0] and "--eagle3-head" in err[0], err[0]
    assert time.perf_counter() - t0 < 10


def test_speculators_default_sliding_layer_exports_as_full_attention(target, tmp_path, capsys):
    """speculators' trainer output as it writes it by default (the draft layer sliding, window 2048)
    exports at --max-len <= 2048 unedited, says so once, and computes the project's own forward."""
    from edgespec.cli import main

    head = _copy("eagle3-speculators", tmp_path, lambda c: _sliding(c, 2048))
    out = tmp_path / "engine"
    assert main(["export", "--target", str(target), "--eagle3-head", str(head), "--out", str(out), *EXPORT_FLAGS]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "sliding_window" in line]
    assert len(said) == 1 and "sliding_window=2048 >= --max-len 128: full attention" in said[0], said
    ref = np.load(FIXTURES / "eagle3-speculators" / "reference.npz")
    for s, got in enumerate(_head_chains(out, ref)):
        assert float(np.abs(got - ref[f"logits_s{s + 1}"]).max()) < 1e-4, s + 1


def test_a_sliding_layer_goes_back_out_sliding_or_is_refused(tmp_path, capsys):
    from edgespec.cli import main
    from edgespec.export.drafters.eagle3.head import read_eagle3

    head = _copy("eagle3-speculators", tmp_path, lambda c: _sliding(c, 2048))
    assert main(["export-drafter", str(head), "--format", "speculators", "--out", str(tmp_path / "spec")]) == 0
    assert read_eagle3(tmp_path / "spec", 64, 256, 8)[0].sliding_window == 2048
    rc = main(["export-drafter", str(head), "--format", "eagle3-official", "--out", str(tmp_path / "official")])
    assert rc == 2 and "sliding_window=2048" in capsys.readouterr().err


def test_mismatched_and_broken_folders_refused_by_preflight(target, tmp_path, monkeypatch, capsys):
    from tiny import make_tiny

    from edgespec.cli import main
    from edgespec.export.target import sources

    monkeypatch.setattr(sources, "load", lambda *a, **k: pytest.fail("the target loaded"))
    narrow = make_tiny("llama", tmp_path / "narrow", hidden_size=32, num_hidden_layers=8)
    shallow = make_tiny("llama", tmp_path / "shallow", num_hidden_layers=4)
    missing = _copy("eagle3-speculators", tmp_path, weights=lambda w: {k: v for k, v in w.items() if k != "fc.weight"})
    broken = _copy("eagle3-specforge", tmp_path)
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:100])
    not_eagle3 = tmp_path / "plain"
    not_eagle3.mkdir()
    (not_eagle3 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    cases = [
        (narrow, FIXTURES / "eagle3-specforge", "the target's hidden size is 32"),
        (shallow, FIXTURES / "eagle3-speculators-variants", "outside this 4-layer target"),
        (target, missing, "lacks fc.weight"),
        (target, broken, "--eagle3-head"),
        (target, not_eagle3, "not an EAGLE-3 head"),
    ]
    capsys.readouterr()  # what making the folders printed
    for tgt, head, why in cases:
        rc = main(
            ["export", "--target", str(tgt), "--eagle3-head", str(head), "--out", str(tmp_path / "o"), *EXPORT_FLAGS]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and why in err[0], (head, err)


# ---- edgespec export-drafter: speculators and the official layout -----------------------------------------------
def _digest(tensors: dict) -> str:
    """tools/published_fixtures/eagle3.py's digest: names and values, in name order."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        a = np.asarray(tensors[k])
        a = np.ascontiguousarray(a.astype(np.float32 if a.dtype.kind == "f" else np.int64))
        h.update(k.encode() + a.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("fmt", ["speculators", "eagle3-official"])
def test_round_trip_of_an_edgespec_head(fmt, tmp_path):
    """edgespec's own head -> export-drafter -> the upstream loader read exactly these tensors and
    computed these logits (recorded by the fixture script) = edgespec's forward of the head; read back,
    the same head, every weight bit for bit."""
    from edgespec.cli import main
    from edgespec.export.drafters._files import load_tensors, weights_file
    from edgespec.export.drafters.eagle3.head import build_eagle3, read_eagle3, rope_tables

    src = FIXTURES / "eagle3-edgespec"
    out = tmp_path / fmt
    assert main(["export-drafter", str(src), "--format", fmt, "--out", str(out)]) == 0
    rec = np.load(src / f"published-{fmt}.npz")
    assert _digest(load_tensors(weights_file(out, ("model.safetensors", "pytorch_model.bin")))) == str(rec["digest"])
    ec0, a0, _ = read_eagle3(src, 64, 256, 8)
    ec, a, _ = read_eagle3(out, 64, 256, 8)
    assert all(np.array_equal(a0[k], a[k]) for k in a0) and set(a0) == set(a)
    assert ec.aux_layers == ec0.aux_layers and ec.rope_theta == ec0.rope_theta
    inputs = np.load(src / "inputs.npz")
    cos, sin = rope_tables(ec, 64)
    head = build_eagle3(ec, a, inputs["embed"], cos, sin).eval()
    n = len(inputs["tokens"])
    with torch.no_grad():
        outs = head(torch.from_numpy(inputs["tokens"])[None], torch.from_numpy(inputs["aux"])[None],
                    torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool), 3)  # fmt: skip
        for s in range(3):
            got = head.logits(outs[s])[0, :N_ROWS].numpy()
            assert np.abs(got - rec[f"{fmt}_logits_s{s + 1}"]).max() < 1e-4, (fmt, s)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fmt", ["speculators", "eagle3-official"])
def test_published_layouts_carry_the_head_or_refuse(case, fmt, tmp_path, capsys):
    """Every fixture written in each layout: read back bit for bit with the same variants, or refused
    with what the layout cannot carry."""
    from edgespec.cli import main
    from edgespec.export.drafters.eagle3.head import read_eagle3

    folder = FIXTURES / CASES[case][0]
    refusals = {
        ("eagle3-specforge-variants-bf16", "speculators"): "logits skip the final norm",
        ("eagle3-specforge-variants-bf16", "eagle3-official"): "an fc norm (per_layer)",
        ("eagle3-speculators-variants-bf16", "eagle3-official"): "norm_before_residual",
        ("eagle3-speculators-fcnorm-bf16", "eagle3-official"): "an fc norm (per_layer)",
    }
    rc = main(["export-drafter", str(folder), "--format", fmt, "--out", str(tmp_path / "out")])
    if (case, fmt) in refusals:
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and refusals[case, fmt] in err[0] and not (tmp_path / "out").exists(), err
        return
    assert rc == 0
    ec0, a0, _ = read_eagle3(folder, 64, 256, 8)
    ec, a, _ = read_eagle3(tmp_path / "out", 64, 256, 8)
    assert set(a0) == set(a) and all(np.array_equal(a0[k], a[k]) for k in a0)
    keep = ("fc_norm", "norm_before_residual", "logits_norm", "feed_normed", "own_embed", "aux_layers", "rope_type",
            "rope_theta", "rope_params", "rms_norm_eps", "head_dim", "draft_vocab_size")  # fmt: skip
    assert all(getattr(ec, k) == getattr(ec0, k) for k in keep), case


def test_the_speculators_verifier_is_named_and_checked(target, tmp_path, capsys):
    """--verifier (or the one the folder records) goes into speculators_config.verifier: a local folder
    checked against the head and written absolute; another model's, a missing path, another format refused."""
    from tiny import make_tiny

    from edgespec.cli import main

    src, out = FIXTURES / "eagle3-edgespec", tmp_path / "spec"
    assert (
        main(["export-drafter", str(src), "--format", "speculators", "--out", str(out), "--verifier", str(target)]) == 0
    )
    verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": str(target.resolve()), "architectures": ["LlamaForCausalLM"]}
    capsys.readouterr()
    assert main(["export-drafter", str(src), "--format", "speculators", "--out", str(tmp_path / "null")]) == 0
    assert "Hint: pass --verifier" in capsys.readouterr().err  # nothing recorded: null, said
    hub = _copy("eagle3-speculators", tmp_path, _set("speculators_config.verifier.name_or_path", "org/model"))
    assert main(["export-drafter", str(hub), "--format", "speculators", "--out", str(tmp_path / "hub")]) == 0
    assert json.loads((tmp_path / "hub" / "config.json").read_text())["speculators_config"]["verifier"] == {
        "name_or_path": "org/model",
        "architectures": ["LlamaForCausalLM"],
    }
    narrow = make_tiny("llama", tmp_path / "narrow", hidden_size=32, num_hidden_layers=8)
    capsys.readouterr()
    for args, why in (
        (["--verifier", str(narrow)], "hidden_size 32 (the head's 64)"),
        (["--verifier", str(tmp_path / "nowhere")], "no such folder"),
        (["--verifier", str(target), "--format", "eagle3-official"], "--format eagle3-official has none"),
    ):
        fmt = [] if "--format" in args else ["--format", "speculators"]
        rc = main(["export-drafter", str(src), *fmt, "--out", str(tmp_path / "o"), *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and why in err[0] and not (tmp_path / "o").exists(), err


SPECULATORS_FORWARD = """
import sys, numpy as np, torch
from speculators.models.attention import create_float_mask
from speculators.models.eagle3 import Eagle3DraftModel
model = Eagle3DraftModel.from_pretrained(sys.argv[1], torch_dtype=torch.float32)  # as published: no patch
model._attn_impl, model._create_mask_fn = "eager", create_float_mask  # dense masks on CPU (no flex attention)
for layer in model.layers:
    layer.self_attn.config._attn_implementation = "eager"
d = np.load(sys.argv[2])
got = []
hook = model.lm_head.register_forward_hook(lambda m, i, o: got.append(o[0, :12].detach().numpy()))
with torch.no_grad():
    model.eval()(hidden_states=torch.from_numpy(d["aux"][None]), input_ids=torch.from_numpy(d["tokens"][None]),
                 document_ids=torch.zeros(1, len(d["tokens"]), dtype=torch.long), ttt_steps=3)
np.savez(sys.argv[3], *got)
"""


def _speculators_env() -> dict | None:
    """The environment a Python with speculators 0.9 runs in: this interpreter, with EDGESPEC_SPECULATORS
    (a folder speculators and the modules it imports were installed into with pip --target --no-deps, as
    tools/published_fixtures/ does) on its path; None: speculators is not there."""
    import os
    import subprocess
    import sys

    env = os.environ | {"HF_HUB_OFFLINE": "1", "TORCHDYNAMO_DISABLE": "1"}  # no hub lookup may happen
    if os.environ.get("EDGESPEC_SPECULATORS"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ["EDGESPEC_SPECULATORS"], env.get("PYTHONPATH")]))
    probe = [sys.executable, "-c", "import speculators.models.eagle3, speculators.utils.loading"]
    return env if subprocess.run(probe, env=env, capture_output=True).returncode == 0 else None


def test_speculators_own_loader_reads_the_published_head_unpatched(target, tmp_path):
    """export-drafter --format speculators --verifier TARGET -> speculators' Eagle3DraftModel.from_pretrained
    offline, nothing patched around it (the embedding it lacks filled from the verifier's weights) ->
    the logits the fixture script recorded for this head, < 1e-4."""
    import subprocess
    import sys

    from edgespec.cli import main

    env = _speculators_env()
    if env is None:
        pytest.skip("speculators 0.9 not importable (EDGESPEC_SPECULATORS: the folder it was pip-installed into)")
    src, out = FIXTURES / "eagle3-edgespec", tmp_path / "spec"
    assert (
        main(["export-drafter", str(src), "--format", "speculators", "--out", str(out), "--verifier", str(target)]) == 0
    )
    script = tmp_path / "forward.py"
    script.write_text(SPECULATORS_FORWARD)
    got = tmp_path / "got.npz"
    run = subprocess.run(
        [sys.executable, str(script), str(out), str(src / "inputs.npz"), str(got)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rec, got = np.load(src / "published-speculators.npz"), np.load(got)
    for s in range(3):
        assert np.abs(got[f"arr_{s}"] - rec[f"speculators_logits_s{s + 1}"]).max() < 1e-4, s + 1
