"""Teacher-forced text data (export/train/text_data.py): text labelled by the engine's own target graph
(features bitwise what the runtime's prefill computes, soft labels its top-k), eval text kept out,
resumable shards, and the EAGLE recipe learning the soft labels by KL."""

import json

import numpy as np
import pytest

from edgespec.export.train import text_data as td

EVAL = td.REPO_PROMPTS / "drafts_eval.jsonl"
PROSE = (
    "The lighthouse keeper rowed out every morning before the fog lifted, counting the buoys and "
    "writing their colours in a small notebook that smelled of tar. "
)


def char_tokenizer():
    """The tiny models' char-level tokenizer (tests/tiny.py), built without transformers."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(32)} | {chr(i): i for i in range(32, 256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return tok


def _eval_text(i: int) -> str:
    row = json.loads(EVAL.read_text().splitlines()[i])
    return "\n".join(m["content"] for m in row["messages"]) if "messages" in row else row["prompt"]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    words = PROSE.split()
    for i in range(6):
        (d / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 120)) + "\n")
    (d / "leak.md").write_text(PROSE + _eval_text(3) + " " + PROSE)  # holds an eval prompt: dropped
    return d


def test_soft_labels_are_the_softmax_top_k():
    logits = np.random.default_rng(0).normal(0, 3, (5, 300)).astype(np.float32)
    ids, probs = td.soft_labels(logits, 4)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert np.array_equal(ids, np.argsort(-p, axis=-1)[:, :4])
    np.testing.assert_allclose(probs, np.take_along_axis(p, ids, -1), rtol=1e-5)


def test_plan_drops_any_stretch_sharing_an_eval_window(text_dir):
    keep_out = td.eval_windows()
    assert td.windows(_eval_text(3)) <= keep_out
    cfg = td.TextDataConfig(engine="-", out="-", sources=(str(text_dir),), seq_tokens=64, max_tokens=10**6)
    p = td.plan(cfg, char_tokenizer(), keep_out)
    assert p.dropped >= 1 and len(p.seqs) >= 20 and p.kinds == {"file": len(p.seqs)}
    for s in p.seqs:
        assert not td.windows("".join(map(chr, s))) & keep_out
    with pytest.raises(td.TextDataError, match="neither"):
        td.plan(td.TextDataConfig(engine="-", out="-", sources=("nowhere",)), char_tokenizer(), keep_out)


@pytest.fixture(scope="module")
def text_data(tiny_engine, text_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("textdata") / "t"
    cfg = td.TextDataConfig(
        engine=str(tiny_engine),
        out=str(out),
        sources=(str(text_dir),),
        seq_tokens=40,
        max_tokens=40 * 10,
        top_k=4,
        shard_seqs=4,
    )
    return td.make_text_data(cfg, progress=False), cfg


def test_features_and_labels_are_the_engine_prefills(tiny_engine, text_data):
    """Every row is what the runtime's prefill of that sequence computes: hidden bitwise, top-1 =
    the logits' argmax; a deleted shard is remade with the same bytes."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.export.train.head_data import load_shards, load_soft
    from edgespec.runtime.prefill import prefill

    out, cfg = text_data
    tokens, feats, starts, n_prompt = load_shards(out)
    ids, probs, has = load_soft(out)
    assert len(n_prompt) == 10 and not n_prompt.any() and has.all() and ids.shape == (400, 4)
    assert (np.diff(probs, axis=1) <= 0).all() and (probs.sum(1) <= 1.001).all()
    man = load_manifest(tiny_engine)
    eng = OrtModel(man, man.target)
    for s in (0, 7):
        seq = tokens[starts[s] : starts[s + 1]].astype(np.int64)
        hidden = np.zeros((man.max_len, man.target.hidden_size), np.float32)
        prefill(eng, seq, 0, hidden_out=hidden)
        assert np.array_equal(feats[starts[s] : starts[s + 1]], hidden[: len(seq)].astype(np.float16))
        for i in (5, 20, 39):  # a decode call after a prefill of the text before: its argmax
            prefill(eng, seq[:i], 0)
            assert int(ids[starts[s] + i, 0]) == int(eng.forward(seq[i : i + 1], i)[0].argmax())
    before = (out / "shard-00001.npz").read_bytes()
    (out / "shard-00001.npz").unlink()
    td.make_text_data(cfg, progress=False)
    assert (out / "shard-00001.npz").read_bytes() == before and (out / "done").exists()
    runs = json.loads((out / "generation.json").read_text())
    assert len(runs) == 2 and runs[-1]["tokens"] == 160 and "target graph" in runs[-1]["compute"]


def test_kl_loss_is_cross_entropy_for_one_hot_and_zero_at_the_target():
    torch = pytest.importorskip("torch")
    from edgespec.export.drafters.eagle.train import _token_loss

    logits = torch.randn(3, 10)
    lab = torch.tensor([1, 4, 7])
    ce = torch.nn.functional.cross_entropy(logits, lab)
    one_hot = (torch.stack([lab, torch.full((3,), -100)], 1), torch.tensor([[0.7, 0.3]] * 3))
    torch.testing.assert_close(_token_loss(logits, lab, one_hot), ce)  # the other id lies outside: renormalized
    p = torch.softmax(logits, -1)
    top = p.topk(10)
    assert float(_token_loss(logits, lab, (top.indices, top.values))) == pytest.approx(0.0, abs=1e-6)


def test_train_eagle_on_self_distillation_plus_text_data(tiny_models, tiny_engine, text_dir, text_data, tmp_path):
    """`train-eagle --text-data DIR`: both folders trained on together, text rows by KL to the soft
    labels; `edgespec text-data` makes such a folder; an unfinished one is refused."""
    from edgespec.cli import main

    out, _ = text_data
    text2 = tmp_path / "text2"
    assert (
        main(
            [
                "text-data",
                "--engine",
                str(tiny_engine),
                "--out",
                str(text2),
                "--sources",
                str(text_dir),
                "--tokens",
                "120",
                "--seq-tokens",
                "40",
            ]
        )
        == 0
    )
    assert (text2 / "done").exists() and np.load(text2 / "shard-00000.npz")["topk_ids"].shape == (120, 8)
    head = tmp_path / "head"
    args = ["train-eagle", "--target", str(tiny_models["llama"]), "--out", str(head), "--prompts", "24"]
    args += ["--max-new-tokens", "12", "--gen-batch", "12", "--minutes", "0.5", "--epochs", "2", "--draft-vocab", "64"]
    assert main(args + ["--text-data", str(out)]) == 0
    rec = json.loads((head / "config.json").read_text())["eagle"]
    assert rec["data"] == f"{head / 'data'},{out}" and rec["holdout"]["tokens"] > 0
    (text2 / "done").unlink()
    assert main(args + ["--text-data", str(text2)]) == 2
