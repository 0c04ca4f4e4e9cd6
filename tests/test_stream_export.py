"""The streaming export (export/target/stream.py): a safetensors target read, quantized and written
one tensor at a time gives the folder the transformers path gives (the same bytes), validated on a
sampled model, checked per tensor; its peak memory follows the largest tensor, not the model."""

import json
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("torch")

from tiny import make_tiny  # noqa: E402

from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.export.target import sampled, stream, tensors  # noqa: E402
from edgespec.export.target.arch import arch_from_config  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, export  # noqa: E402
from edgespec.export.target.spec import ExportError  # noqa: E402

KW = dict(max_len=128, k=2, prefill_chunk=16, kv_bucket=32, trees=False, progress=False)
FILES = ("target.onnx", "target.weights", "tokenizer.json")


@pytest.fixture
def small_blocks(monkeypatch):
    """Row blocks, file pieces and the sampled vocabulary small enough that tiny models take many."""
    monkeypatch.setattr(stream, "CHUNK_BYTES", 3000)
    monkeypatch.setattr(tensors, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(sampled, "VOCAB_ROWS", 40)


def _both(src, tmp_path, **kw):
    """(streamed folder, transformers folder) of one target and settings."""
    new = export(ExportConfig(target=str(src), out=str(tmp_path / "new" / "e"), **KW, **kw))
    old = export(
        ExportConfig(target=str(src), out=str(tmp_path / "old" / "e"), stream_weights="off", validate=False, **KW, **kw)
    )
    return new, old


def _same_folder(new, old) -> None:
    for f in FILES:
        assert (new / f).read_bytes() == (old / f).read_bytes(), f
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (new, old))
    for m in (a, b):
        m.pop("created")
        m["target"].pop("validation")
    assert a == b


CASES = {  # family -> (make_tiny overrides, precision): each family's own tensors, F32 and F16 files
    "llama": (dict(num_hidden_layers=4), "int4"),  # tied head: the 8-bit LM head from the embedding
    "qwen2": (dict(tie_word_embeddings=False), "int4"),  # q/k/v biases, an untied head
    "qwen3": (dict(), "int8"),  # q/k norms; the integer linears, stored whole
    "gemma3_text": (
        dict(
            num_hidden_layers=3,
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            tie_word_embeddings=True,
        ),
        "int4",
    ),
    "mistral": (dict(), "fp32"),
}


@pytest.mark.parametrize("family", list(CASES))
def test_streamed_folder_is_the_transformers_folder(family, small_blocks, tmp_path, capsys):
    overrides, precision = CASES[family]
    src = make_tiny(family, tmp_path / "src", **overrides)
    if family == "qwen2":  # an F16 checkpoint: widened exactly, as transformers does
        import torch
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(src).to(torch.float16).save_pretrained(src)
    new, old = _both(src, tmp_path, precision=precision)
    _same_folder(new, old)
    m = load_manifest(new)
    assert len(m.target.validation) == 4 and max(m.target.validation.values()) < 3.0, m.target.validation


def test_synthetic_bf16_model_streams_to_the_same_folder(small_blocks, tmp_path, capsys):
    import dataclasses
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[1] / "tools/synthetic_model.py"
    spec = importlib.util.spec_from_file_location("synthetic_model", path)
    synth = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_model"] = synth
    spec.loader.exec_module(synth)
    small = dataclasses.replace(  # llama-3.1-8b's layout (untied, llama3 rope, bf16 shards) scaled down
        synth.CONFIGS["llama-3.1-8b"], hidden_size=64, intermediate_size=128, n_layers=5, n_heads=4, n_kv_heads=2,
        head_dim=16, vocab_size=300,
    )  # fmt: skip
    synth.CONFIGS["tiny"] = small
    monkey_shard = synth.SHARD_BYTES
    synth.SHARD_BYTES = 60_000  # several shards and their index
    try:
        synth.main(["--config", "tiny", "--out", str(tmp_path / "src")])
    finally:
        synth.SHARD_BYTES = monkey_shard
    assert len(list((tmp_path / "src").glob("*.safetensors"))) > 2
    new = export(
        ExportConfig(
            target=str(tmp_path / "src"), out=str(tmp_path / "new" / "e"), precision="int4", **KW | {"progress": True}
        )
    )
    err = capsys.readouterr().err
    assert "streaming export" in err and "layers [0, 1] of 5" in err, err
    old = export(
        ExportConfig(
            target=str(tmp_path / "src"),
            out=str(tmp_path / "old" / "e"),
            precision="int4",
            stream_weights="off",
            validate=False,
            **KW,
        )
    )
    _same_folder(new, old)


def test_what_does_not_stream_takes_the_transformers_path(tmp_path, capsys):
    src = make_tiny("llama", tmp_path / "src")
    export(ExportConfig(target=str(src), out=str(tmp_path / "a"), draft="self:1", **KW | {"progress": True}))
    assert "export through transformers" in capsys.readouterr().err  # a drafter model reads the PyTorch model
    from safetensors.numpy import load_file, save_file

    w = load_file(src / "model.safetensors")
    save_file(w | {"model.extra.weight": np.zeros(3, np.float32)}, src / "model.safetensors", metadata={"format": "pt"})
    export(ExportConfig(target=str(src), out=str(tmp_path / "b"), **KW | {"progress": True}))
    err = capsys.readouterr().err
    assert "tensors the graphs do not read (model.extra.weight)" in err, err


def test_a_wrong_tensor_is_caught_by_the_block_check():
    from edgespec.export.target.quant import quantize_int4

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    codes, scales, zp, used = quantize_int4(w, 32)
    names = ("x.q4", "x.scales", "x.zp")
    got = dict(zip(names, (codes, scales, zp), strict=True))
    stream._check_blocks("x", w, got, names, 4, used, 32)  # as stored: passes
    with pytest.raises(ExportError, match="not the one read"):
        stream._check_blocks("x", w[::-1].copy(), got, names, 4, used, 32)  # rows of another order
    with pytest.raises(ExportError, match="do not decode"):
        stream._check_blocks("x", w, got, names, 4, used + 1e-3, 32)


def test_spill_store_writes_the_bytes_write_weights_writes(tmp_path):
    from edgespec.export.target.weights import write_weights

    rng = np.random.default_rng(0)
    arrays = {"b": rng.standard_normal((5, 7)).astype(np.float32), "a": np.arange(13, dtype=np.uint8)}
    arrays["c"] = rng.integers(0, 255, (9, 3, 2), dtype=np.uint8)
    store = tensors.SpillStore(tmp_path / "spool")
    for name, arr in arrays.items():
        if name == "c":  # row blocks, interleaved with another array's
            store.append("c", arr[:4])
            store.add("d", np.ones(3, np.float32))
            store.append("c", arr[4:])
            store.finish("c", arr.shape)
        else:
            store.add(name, arr)
    assert np.array_equal(np.asarray(store.arrays["c"]), arrays["c"])
    index = store.write(tmp_path / "spilled.weights")
    want = write_weights(arrays | {"d": np.ones(3, np.float32)}, tmp_path / "plain.weights")
    assert index == want
    assert (tmp_path / "spilled.weights").read_bytes() == (tmp_path / "plain.weights").read_bytes()
    assert not (tmp_path / "spool").exists()


def _synthetic_layers(folder, n_layers: int) -> None:
    """An untied llama of n_layers whose largest tensor (the gate/up rows, 1 MB in bf16) is fixed."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    h, inter, vocab = 256, 1024, 512
    cfg = AutoConfig.for_model(
        "llama", hidden_size=h, intermediate_size=inter, num_hidden_layers=n_layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=False, max_position_embeddings=1024,
    )  # fmt: skip
    folder.mkdir()
    cfg.save_pretrained(folder)
    from tiny import tokenizer_files

    tokenizer_files(folder)
    g = torch.Generator().manual_seed(0)
    shapes = stream.expected_tensors(arch_from_config(cfg, 128))
    tensors_ = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in shapes.items()}
    save_file(tensors_, folder / "model.safetensors")


def test_peak_memory_follows_the_largest_tensor_not_the_model(tmp_path):
    """numpy's allocations (tracemalloc sees them) during a streamed int4 export, without validation:
    a model 8x deeper (~8x the weights) peaks within one largest tensor of the shallow one, far under
    its size."""
    peaks, sizes = {}, {}
    for n in (2, 2, 16):  # the first run warms imports and caches up
        src = tmp_path / f"m{n}"
        if not src.exists():
            _synthetic_layers(src, n)
        sizes[n] = sum(f.stat().st_size for f in src.glob("*.safetensors")) * 2  # float32 bytes
        tracemalloc.start()
        out = tmp_path / f"e{n}"
        export(ExportConfig(target=str(src), out=str(out), precision="int4", validate=False, force=True, **KW))
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    largest = 2 * 1024 * 256 * 4  # gate and up rows concatenated, float32
    assert peaks[16] < peaks[2] + largest, (peaks, sizes)
    assert peaks[16] < sizes[16] / 4, (peaks, sizes)
