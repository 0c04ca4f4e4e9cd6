"""Self-distillation through the exact graph (export/train/answer_data.py): the engine's own Generator
answers (speculative, so the tokens must be plain greedy decoding's), each prompt + answer is
labelled by the target graph (features bitwise the runtime's prefill), eval prompts stay out,
shards resume with the same bytes."""

import json

import numpy as np
import pytest

from edgespec.export.train import answer_data as ad
from edgespec.export.train import text_data as td

PROMPTS = [
    {"id": "p0", "kind": "short", "messages": [{"role": "user", "content": "Name a colour."}]},
    {"id": "p1", "kind": "short", "messages": [{"role": "user", "content": "Count to five, please."}]},
    {
        "id": "p2",
        "kind": "multiturn",
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "Again, louder."},
        ],
    },
]


@pytest.fixture(scope="module")
def answers(tiny_engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("answers")
    # a folder with prompts.jsonl answers those (how a resumed run keeps its plan)
    (out / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    cfg = ad.AnswerDataConfig(
        engine=str(tiny_engine),
        out=str(out),
        n_prompts=3,
        max_new_tokens=12,
        drafter="draft",
        top_k=4,
        shard_seqs=2,
        threads=1,
    )
    ad.make_answer_data(cfg, progress=False)
    return out, cfg


def test_answers_are_plain_greedy_and_features_the_prefill(tiny_engine, answers):
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.train.head_data import load_shards, load_soft
    from edgespec.export.train.train_data import SoftLabels
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.prefill import prefill

    out, cfg = answers
    tokens, feats, starts, n_prompt = load_shards(out)
    soft = load_soft(out)
    assert len(n_prompt) == 3 and soft[2].all()
    plain = Generator.load(tiny_engine, RuntimeConfig(drafter="none"))
    man = load_manifest(tiny_engine)
    eng = OrtModel(man, man.target)
    emitted = SoftLabels(*soft).labels(tokens, starts)
    for s, row in enumerate(PROMPTS):
        seq = tokens[starts[s] : starts[s + 1]].astype(np.int64)
        ids = plain.codec.encode(row["messages"])
        assert n_prompt[s] == len(ids) and np.array_equal(seq[: len(ids)], ids)
        want = np.concatenate([np.array(x) for x in plain.generate_ids(ids, cfg.max_new_tokens)])
        assert np.array_equal(seq[len(ids) :], want)  # the drafter's answer is plain decoding's
        # at answer positions the graph's argmax given the text before is the answer's own token
        assert np.array_equal(emitted[starts[s] + len(ids) : starts[s + 1]], seq[len(ids) :])
        hidden = np.zeros((man.max_len, man.target.hidden_size), np.float32)
        prefill(eng, seq, 0, hidden_out=hidden)
        assert np.array_equal(feats[starts[s] : starts[s + 1]], hidden[: len(seq)].astype(np.float16))


def test_answer_shards_resume_with_the_same_bytes(answers):
    out, cfg = answers
    before = (out / "shard-00001.npz").read_bytes()
    (out / "shard-00001.npz").unlink()
    ad.make_answer_data(cfg, progress=False)
    assert (out / "shard-00001.npz").read_bytes() == before and (out / "done").exists()
    runs = json.loads((out / "generation.json").read_text())
    assert len(runs) == 2 and "drafter draft" in runs[-1]["compute"]


def test_prompts_sharing_an_eval_window_are_dropped(monkeypatch, tmp_path):
    row = json.loads((td.REPO_PROMPTS / "drafts_eval.jsonl").read_text().splitlines()[5])
    leak = {
        "id": "leak",
        "kind": "writing",
        "messages": [{"role": "user", "content": "Please: " + row["messages"][0]["content"]}],
    }
    monkeypatch.setattr(
        "edgespec.export.train.wide_prompts.wide_prompts",
        lambda n, seed, families=(): [PROMPTS[0], leak, PROMPTS[1]][:n],
    )
    kept, dropped = ad.plan_prompts(ad.AnswerDataConfig(engine="-", out=str(tmp_path), n_prompts=3), td.eval_windows())
    assert [r["id"] for r in kept] == ["p0", "p1"] and dropped == 1


def test_families_pick_the_mix_and_an_unknown_one_is_refused_before_any_work(tmp_path):
    cfg = ad.AnswerDataConfig(engine="-", out=str(tmp_path / "a"), n_prompts=12, families=("code",))
    kept, _ = ad.plan_prompts(cfg, set())
    assert len(kept) == 12 and {r["kind"] for r in kept} == {"code"}
    bad = ad.AnswerDataConfig(engine="-", out=str(tmp_path / "b"), families=("code", "poems"))
    with pytest.raises(td.TextDataError, match="no family poems"):
        ad.make_answer_data(bad, progress=False)
    assert not (tmp_path / "b").exists()


def test_answers_from_labels_the_same_sequences_with_aux_features(tiny_models, answers, tmp_path):
    """`answers_from`: an earlier folder's sequences, labelled through another folder's target graph
    (here one with hidden_aux): same tokens, aux rows that are the residual stream entering the aux
    layers (the PyTorch model's hidden_states), and features and labels bitwise the plain graph's
    (outputting the stream must not change what the target computes)."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.export.target.exporter import ExportConfig, export
    from edgespec.export.target.spec import aux_layers
    from edgespec.export.train.head_data import load_aux, load_shards

    src, cfg = answers
    from tiny import TINY_EXPORT

    # the tiny_engine's settings: the relabelled features must come from a graph of the same shape
    aux_cfg = ExportConfig(
        target=str(tiny_models["llama"]), eagle3_features=True, out=str(tmp_path / "aux"), **TINY_EXPORT
    )
    engine = export(aux_cfg)
    out = tmp_path / "relabelled"
    ad.make_answer_data(ad.AnswerDataConfig(engine=str(engine), out=str(out), answers_from=str(src), top_k=4), False)
    tokens, _, starts, n_prompt = load_shards(out)
    want = load_shards(src)
    assert np.array_equal(tokens, want[0]) and np.array_equal(starts, want[2]) and np.array_equal(n_prompt, want[3])
    assert (out / "prompts.jsonl").read_text() == (src / "prompts.jsonl").read_text() and (out / "done").exists()
    for name in sorted(p.name for p in src.glob("shard-*.npz")):
        a, b = np.load(src / name), np.load(out / name)
        for key in ("features", "topk_ids", "topk_probs"):
            assert np.array_equal(a[key], b[key]), (name, key)
    aux = load_aux(out).astype(np.float32)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_models["llama"]), torch_dtype=torch.float32)
    layers = aux_layers(model.config.num_hidden_layers)
    for s in range(len(n_prompt)):
        seq = torch.from_numpy(tokens[starts[s] : starts[s + 1]].astype(np.int64))[None]
        with torch.no_grad():
            hs = model(seq, output_hidden_states=True).hidden_states
        ref = torch.cat([hs[layer][0] for layer in layers], dim=-1).numpy()
        np.testing.assert_allclose(aux[starts[s] : starts[s + 1]], ref, atol=2e-2, rtol=1e-2)
    with pytest.raises(td.TextDataError, match="no answer shards"):
        empty = ad.AnswerDataConfig(engine=str(engine), out=str(tmp_path / "x"), answers_from=str(tmp_path))
        ad.make_answer_data(empty, False)


def test_eval_answers_are_never_trained_on_or_relabelled(answers, tmp_path):
    """A folder marked EVAL (tools/head_accept.py's answers to an eval prompt file) is refused by
    every trainer's data loading and by answer-data's relabelling, with a hint."""
    from edgespec.export.drafters.eagle.train import TrainConfig
    from edgespec.export.train import train_data

    src, _ = answers
    marked = tmp_path / "eval-answers"
    marked.mkdir()
    for p in src.glob("shard-*.npz"):
        (marked / p.name).write_bytes(p.read_bytes())
    (marked / td.EVAL_MARK).write_text("eval\n")
    with pytest.raises(train_data.TrainDataError, match="eval answers"):
        train_data.prepare(TrainConfig(data=f"{src},{marked}", out=str(tmp_path / "head")))
    with pytest.raises(td.TextDataError, match="eval answers"):
        ad.make_answer_data(ad.AnswerDataConfig(engine="-", out=str(tmp_path / "x"), answers_from=str(marked)), False)
