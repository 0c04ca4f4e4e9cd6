"""The streaming export (export/target/graph/streaming.py): a safetensors target read, quantized and written
one tensor at a time gives the folder the transformers path gives (the same bytes), validated on a
sampled model, checked per tensor; its peak memory follows the largest tensor, not the model."""

import json
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("torch")

from tiny import make_tiny  # noqa: E402

from edgespec.engines.manifest import load_manifest  # noqa: E402
from edgespec.export.target.arch import arch_from_config  # noqa: E402
from edgespec.export.target.checks import sampled  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, export  # noqa: E402
from edgespec.export.target.graph import store as weight_store  # noqa: E402
from edgespec.export.target.graph import streaming  # noqa: E402
from edgespec.export.target.sources import safetensors as checkpoint_reads  # noqa: E402
from edgespec.export.target.sources.safetensors import expected_tensors  # noqa: E402
from edgespec.export.target.spec import ExportError  # noqa: E402

KW = dict(max_len=128, k=2, prefill_chunk=16, kv_bucket=32, trees=False, progress=False)
FILES = ("target.onnx", "target.weights", "tokenizer.json")


@pytest.fixture
def small_blocks(monkeypatch):
    """Row blocks, file pieces and the sampled vocabulary small enough that tiny models take many."""
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 3000)
    monkeypatch.setattr(checkpoint_reads, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(weight_store, "CHUNK_BYTES", 1000)
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
    from edgespec.export.target.quant.quantize import quantize_int4

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    codes, scales, zp, used = quantize_int4(w, 32)
    names = ("x.q4", "x.scales", "x.zp")
    got = dict(zip(names, (codes, scales, zp), strict=True))
    streaming._check_blocks("x", w, got, names, 4, used, 32)  # as stored: passes
    with pytest.raises(ExportError, match="not the one read"):
        streaming._check_blocks("x", w[::-1].copy(), got, names, 4, used, 32)  # rows of another order
    with pytest.raises(ExportError, match="do not decode"):
        streaming._check_blocks("x", w, got, names, 4, used + 1e-3, 32)


def test_spill_store_writes_the_bytes_write_weights_writes(tmp_path):
    from edgespec.export.target.graph.store import write_weights

    rng = np.random.default_rng(0)
    arrays = {"b": rng.standard_normal((5, 7)).astype(np.float32), "a": np.arange(13, dtype=np.uint8)}
    arrays["c"] = rng.integers(0, 255, (9, 3, 2), dtype=np.uint8)
    store = weight_store.SpillStore(tmp_path / "spool")
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
    shapes = expected_tensors(arch_from_config(cfg, 128))
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


# ---- GGUF targets ------------------------------------------------------------------------------------
GGUF_FAMILIES = {  # GGUF architecture -> transformers model_type and its config's own options
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),  # q/k/v biases
    "qwen3": ("qwen3", {}),  # q/k norms
    "gemma3": ("gemma3_text", {"head_dim": 64, "sliding_window": 16}),  # norms stored as 1 + w, sandwich norms
}
GGUF_TYPES = ("Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16", "Q5_0", "Q3_K", "BF16")  # the 2-D tensors', in turn


def _family_gguf(path, gguf_arch: str, seed: int = 0):
    """A tiny random GGUF of a family, written by the gguf package (no vocabulary: transformers'
    tensor loader needs none): its 2-D tensors in GGUF_TYPES by turns, its 1-D ones F32 around 1.
    Returns (path, its HF config as transformers makes it from the header)."""
    import gguf
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from edgespec.export.target.sources.gguf import gguf_names

    mt, extra = GGUF_FAMILIES[gguf_arch]
    hidden, n_heads, n_kv, inter, vocab, n_layers = 256, 4, 2, 512, 64, 2
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), gguf_arch)
    w.add_block_count(n_layers)
    w.add_context_length(1024)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_key_length(64)
    w.add_value_length(64)
    w.add_rope_dimension_count(64)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    if gguf_arch == "gemma3":
        w.add_sliding_window(16)
    cfg = AutoConfig.for_model(
        mt, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=n_layers, num_attention_heads=n_heads,
        num_key_value_heads=n_kv, vocab_size=vocab, tie_word_embeddings=True, **extra,
    )  # fmt: skip
    want = expected_tensors(arch_from_config(cfg, 128))
    names = gguf_names(gguf_arch, n_layers, want)
    for i, (hf, shape) in enumerate(want.items()):
        if len(shape) == 1:
            w.add_tensor(names[hf], (1 + rng.normal(0, 0.1, shape)).astype(np.float32))
            continue
        qtype = gguf.GGMLQuantizationType[GGUF_TYPES[i % len(GGUF_TYPES)]]
        x = rng.normal(0, 0.05, shape).astype(np.float32)
        if qtype.name in ("Q4_K", "Q6_K", "Q3_K"):  # gguf-py cannot quantize K-quants: random blocks, small d
            per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (x.size // per_block, type_size), dtype=np.uint8)
            at = {"Q3_K": (108,), "Q4_K": (0, 2), "Q6_K": (208,)}[qtype.name]
            for off in at:
                raw[:, off : off + 2] = np.full((len(raw), 1), 1e-3, np.float16).view(np.uint8)
            data = raw.reshape(shape[0], -1)
        elif qtype.name == "F16":
            data = x.astype(np.float16)
        else:
            data = gguf.quants.quantize(x, qtype)
        w.add_tensor(names[hf], data, raw_dtype=qtype if qtype.name not in ("F16",) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parsed = load_gguf_checkpoint(str(path))["config"]
    return path, AutoConfig.for_model(parsed.pop("model_type"), **parsed)


@pytest.mark.parametrize("gguf_arch", list(GGUF_FAMILIES))
def test_gguf_tensors_are_what_transformers_loader_gives(gguf_arch, monkeypatch, tmp_path):
    """Every tensor the streamed reader gives (names, llama's q/k rows, gemma's norms - 1, every
    type) is bitwise the tensor transformers' GGUF loader gives the model; every quantized one's
    blocks are kept and dequantize to it; read in row pieces of ~1 kB."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from edgespec.export.target.sources import gguf as gguf_stream

    monkeypatch.setattr(gguf_stream, "CHUNK_BYTES", 1000)
    path, cfg = _family_gguf(tmp_path / f"{gguf_arch}.gguf", gguf_arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    ours = gguf_stream.open_gguf(path, arch_from_config(cfg, 128), cfg, keep_blocks=True)
    assert set(ours.entries) == set(theirs)
    if gguf_arch == "llama":
        assert any(e.heads for e in ours.entries.values())
    if gguf_arch == "gemma3":
        assert sum(e.minus_one for e in ours.entries.values()) == 1 + 2 * 6  # final, 4 sandwich + q/k norms a layer
    for name, t in theirs.items():
        got = ours[name]
        assert got.dtype == np.float32 and np.array_equal(got, t.numpy()), name
        rows = np.array([0, 2, 3, len(got) - 1]) if got.ndim == 2 else None
        if rows is not None:
            assert np.array_equal(ours.rows(name, rows), t.numpy()[rows]), name
            part = ours.part(name, len(got), got, True)
            assert part.blocks is not None or part.source in ("F16", "BF16"), (name, part)
            if part.blocks is not None:
                assert np.array_equal(part.blocks.dequantized(), got), name
                sampled = ours.part(name, len(rows), got[rows], True, rows)
                assert np.array_equal(sampled.blocks.dequantized(), got[rows]), name


@pytest.fixture
def gguf_small_blocks(small_blocks, monkeypatch):
    from edgespec.export.target.sources import gguf as gguf_stream

    monkeypatch.setattr(gguf_stream, "CHUNK_BYTES", 1000)


@pytest.mark.parametrize(
    "kw",
    [
        dict(precision="int4"),  # Q4_1 / K-quant blocks kept (MatMulNBits, block mins), the 8-bit LM head
        dict(precision="int4", int4_kernel="rowop"),  # the same blocks packed for the row kernel by rows
        dict(precision="int8"),
        dict(precision="fp32"),  # linears stored [in, out] by column blocks
    ],
    ids=["int4", "int4-rowop", "int8", "fp32"],
)
def test_gguf_streams_to_the_transformers_folder(kw, gguf_small_blocks, tmp_path, capsys):
    from tiny import GGUF_LINEARS, make_tiny_gguf

    if kw.get("int4_kernel") == "rowop":
        from edgespec.engines import rowop

        if rowop.unavailable():
            pytest.skip(f"row kernel not available: {rowop.unavailable()}")
    types = dict.fromkeys(GGUF_LINEARS, "Q4_1") | {"attn_v": "Q4_K", "ffn_up": "F16", "ffn_down": "Q6_K"}
    src = make_tiny_gguf(tmp_path / "m.gguf", types | {"output": "Q8_0"}, tied=False)
    new = export(ExportConfig(target=str(src), out=str(tmp_path / "new" / "e"), **KW | {"progress": True}, **kw))
    err = capsys.readouterr().err
    assert "streaming export: GGUF read" in err and "validated a sampled model" in err, err
    old = export(
        ExportConfig(target=str(src), out=str(tmp_path / "old" / "e"), stream_weights="off", validate=False, **KW, **kw)
    )
    _same_folder(new, old)
    origins = load_manifest(new).target.weight_origins
    if kw["precision"] == "int4":
        assert {o.kind for o in origins if o.exact} >= {"self_attn.q_proj", "mlp.down_proj", "lm_head"}, origins


def test_a_gguf_the_reader_does_not_know_takes_the_transformers_path_and_says_why(tmp_path, monkeypatch, capsys):
    from tiny import make_tiny_gguf

    from edgespec.export.target.sources import gguf as gguf_stream

    src = make_tiny_gguf(tmp_path / "m.gguf", {})
    monkeypatch.setattr(gguf_stream, "TYPES", ("F32", "F16", "BF16"))
    export(
        ExportConfig(
            target=str(src), out=str(tmp_path / "a"), precision="int4", validate=False, **KW | {"progress": True}
        )
    )
    err = capsys.readouterr().err
    assert "export through transformers" in err and "Q8_0, a type the streaming export does not read" in err, err


@pytest.mark.parametrize(
    "kw", [dict(precision="int4", int4_kernel="rowop"), dict(precision="fp16")], ids=["rowop", "fp16"]
)
def test_row_kernel_and_float_linears_stream_to_the_same_folder(kw, small_blocks, tmp_path):
    """The row kernel's packed linears (re-quantized by rows, packed with the whole matrix's
    choices) and fp16 linears (column blocks) are the transformers path's bytes; untied head."""
    if kw.get("int4_kernel") == "rowop":
        from edgespec.engines import rowop

        if rowop.unavailable():
            pytest.skip(f"row kernel not available: {rowop.unavailable()}")
    src = make_tiny("llama", tmp_path / "src", tie_word_embeddings=False)
    new, old = _both(src, tmp_path, **kw)
    _same_folder(new, old)
