"""Export: tiny models of each architecture, validated against PyTorch; bad inputs; safe output."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from tiny import assert_rows_bitwise_alike  # noqa: E402

from edgespec.engines.manifest import ManifestError, load_manifest  # noqa: E402
from edgespec.export.target.arch import UnsupportedModelError  # noqa: E402
from edgespec.export.target.exporter import ExportConfig, ExportError, export  # noqa: E402
from edgespec.export.target.sources.resolve import SourceError  # noqa: E402


def _export(src, out, **kw):
    kw.setdefault("precision", "fp32")
    return export(
        ExportConfig(
            target=str(src), out=str(out), max_len=128, k=3, prefill_chunk=16, kv_bucket=32, progress=False, **kw
        )
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_tiny_architectures_export_and_match_pytorch(arch, tiny_models, tmp_path):
    folder = _export(tiny_models[arch], tmp_path / arch)
    m = load_manifest(folder)
    assert m.target.widths() == [1, 2, 3, 4, 16]
    assert [m.target.graph.phase(w) for w in m.target.widths()] == ["decode", "verify", "verify", "verify", "prefill"]
    diffs = m.target.validation
    assert len(diffs) == 5 and max(diffs.values()) < 1e-4, diffs


def test_llama3_rope_scaling_and_untied_head(tmp_path):
    from tiny import make_tiny

    src = make_tiny(
        "llama",
        tmp_path / "src",
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    m = load_manifest(_export(src, tmp_path / "out"))
    assert max(m.target.validation.values()) < 1e-4


@pytest.mark.parametrize("draft", ["self:1", "self:int4"])
def test_int4_target_and_drafts(draft, tiny_models, tmp_path):
    m = load_manifest(
        _export(tiny_models["llama"], tmp_path / "e", precision="int4", draft=draft, int4_accuracy_level=0)
    )
    assert m.target.precision == "int4" and m.models()["draft"].kind == draft
    assert "l0.qkv.q4" in m.target.weights
    for role in ("target", "draft"):  # int4 is checked against PyTorch running the dequantized weights
        assert max(m.models()[role].validation.values()) < 2e-3


def test_self_draft_shares_the_target_weights_file(tiny_engine):
    m = load_manifest(tiny_engine)
    assert m.models().get("draft").kind == "self:1" and m.models().get("draft").n_layers == 1
    assert m.models().get("draft").weights_file == m.target.weights_file == "target.weights"
    assert not (tiny_engine / "draft.weights").exists()


def test_graph_runs_in_a_plain_onnxruntime_session_with_static_shapes(tiny_engine):
    import onnxruntime as ort

    from edgespec.engines import rope

    m = load_manifest(tiny_engine)
    so = ort.SessionOptions()
    keep = rope.add_computed(so, m.target)  # the rotary tables: computed at load, not stored
    assert sorted(n for n, w in m.target.weights.items() if w.rope) == ["rope_cos_half", "rope_sin_half"] and keep
    sess = ort.InferenceSession(str(tiny_engine / m.target.graph.file), so)
    feed = {
        "input_ids": np.array([[5, 6, 7, 8]]),
        "positions": np.arange(4)[None],
        "past_len": np.array([0]),
        "tree_mask": np.tril(np.ones((4, 4), np.int64)),
    }  # a chain
    for i in range(m.target.n_layers):
        feed[f"past_key_{i}"] = feed[f"past_value_{i}"] = np.zeros((32, m.target.kv_width), np.float32)
    logits, new_kv, hidden, topk_ids, topk_probs = sess.run(None, feed)
    assert topk_ids.shape == topk_probs.shape == (1, 4, 8) and (topk_ids[0, :, 0] == logits[0].argmax(-1)).all()
    assert logits.shape == (1, 4, 256) and new_kv.shape == (2, 2, 4, m.target.kv_width)
    assert hidden.shape == (1, 4, 64) and np.isfinite(logits).all()


def test_eagle3_features_match_the_hf_hidden_states(tmp_path):
    """--eagle3-features: hidden_aux = the residual stream entering layers 2, L/2, L-3, concatenated."""
    import torch
    from tiny import make_tiny
    from transformers import AutoModelForCausalLM

    from edgespec.engines.ort import OrtModel
    from edgespec.export.target.spec import aux_layers

    src = make_tiny("llama", tmp_path / "src", num_hidden_layers=6)
    out = export(
        ExportConfig(
            target=str(src),
            out=str(tmp_path / "e"),
            max_len=64,
            k=2,
            prefill_chunk=8,
            kv_bucket=16,
            precision="fp32",
            eagle3_features=True,
            progress=False,
        )
    )
    m = load_manifest(out)
    assert aux_layers(6) == (2, 3) and m.target.aux_layers == (2, 3) and m.target.aux_width == 2 * 64
    assert aux_layers(30) == (2, 15, 27)
    engine = OrtModel(m, m.target)
    tokens = np.arange(5, 19)
    feats = np.zeros((14, 2 * 64), np.float32)
    past = 0
    for chunk in (tokens[:8], tokens[8:11], tokens[11:]):  # prefill, then verify-width calls
        engine.forward(chunk, past)
        engine.commit(past, len(chunk))
        feats[past : past + len(chunk)] = engine.last_hidden_aux(len(chunk))
        past += len(chunk)
    with torch.no_grad():
        hs = AutoModelForCausalLM.from_pretrained(src)(torch.from_numpy(tokens[None]), output_hidden_states=True)
    ref = torch.cat([hs.hidden_states[i][0] for i in (2, 3)], dim=-1).numpy()  # [i] = input of layer i
    assert np.abs(feats - ref).max() < 1e-4


def test_manifest_records_the_contract(tiny_engine):
    d = json.loads((tiny_engine / "manifest.json").read_text())
    assert d["format"] == "edgespec.engine" and d["version"] == 3
    assert d["eos_token_ids"] == [1] and d["chat_template_file"]
    assert d["source"]["sha256"] and d["source"]["kind"] == "hf"
    g = d["target"]["graph"]  # one entry per graph: its widths, phases and I/O declared once
    assert g["widths"] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 16] and g["phases"]["prefill"] == [16]
    assert {i["name"] for i in g["inputs"]} >= {"input_ids", "positions", "past_len", "past_{kind}_{layer}"}
    assert next(i for i in g["inputs"] if i["name"] == "input_ids")["shape"] == [1, "T"]
    assert next(i for i in g["inputs"] if i["name"] == "past_{kind}_{layer}")["layers"] == 2
    assert [o["name"] for o in g["outputs"]] == ["logits", "new_kv", "hidden", "topk_ids", "topk_probs"]


def test_manifest_declares_each_graphs_io_in_graph_order(tiny_engine):
    import onnx

    m = load_manifest(tiny_engine)
    for spec in (m.target, m.models().get("draft")):
        g = onnx.load(m.path(spec.graph.file), load_external_data=False).graph
        assert [i.name for i in g.input] == list(spec.graph.input_names()), spec.role
        assert [o.name for o in g.output] == list(spec.graph.output_names()), spec.role


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"k": 0}, "--k must be >= 1"),
        ({"max_len": 8, "prefill_chunk": 16}, "smaller than the prefill chunk"),
        ({"precision": "int3"}, "--precision"),
        ({"max_len": 100}, "multiple of --kv-bucket"),
        ({"kv_bucket": 24, "max_len": 120}, "multiple of 16"),
    ],
)
def test_bad_arguments_are_refused_clearly(kw, match, tiny_models, tmp_path):
    args = (
        dict(
            target=str(tiny_models["llama"]),
            out=str(tmp_path / "x"),
            max_len=128,
            k=3,
            prefill_chunk=16,
            kv_bucket=32,
            progress=False,
            precision="fp32",
        )
        | kw
    )
    with pytest.raises(ExportError, match=match):
        export(ExportConfig(**args))
    assert not (tmp_path / "x").exists()


def test_bad_sources_are_refused_clearly(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        _export(tmp_path / "missing.gguf", tmp_path / "o")
    (tmp_path / "model.bin").write_bytes(b"xx")
    with pytest.raises(SourceError, match="not a .gguf"):
        _export(tmp_path / "model.bin", tmp_path / "o")
    (tmp_path / "fake.gguf").write_bytes(b"NOTGGUF")
    with pytest.raises(SourceError, match="magic"):
        _export(tmp_path / "fake.gguf", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="without config.json"):
        _export(tmp_path / "empty", tmp_path / "o")


def test_unsupported_architecture_names_what_is_missing():
    from transformers import AutoConfig

    from edgespec.export.target.arch import arch_from_config

    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2' is not supported"):
        arch_from_config(AutoConfig.for_model("gpt2"), 128)
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        arch_from_config(AutoConfig.for_model("llama", hidden_act="gelu"), 128)
    with pytest.raises(UnsupportedModelError, match="rope type"):
        arch_from_config(AutoConfig.for_model("llama", rope_scaling={"rope_type": "yarn", "factor": 2.0}), 128)


def _config_only(folder, model_type="llama", **kw):
    """A folder holding a config.json and nothing else (no weights, no tokenizer)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, **kw).to_dict() if model_type != "unknown" else {"model_type": "mamba2x"}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg | kw))
    return folder


def _gguf_header_only(path, arch="llama", **keys):
    """A GGUF of one small tensor whose header says `arch` (and keys: {suffix: value} under it)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_feed_forward_length(128)
    w.add_context_length(512)
    for key, value in keys.items():
        w.add_string(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: _config_only(p / "mamba", "mamba"), "model_type 'mamba' .* is not supported"),
        (lambda p: _config_only(p / "new", "unknown"), "model_type 'mamba2x' .* is not supported"),
        (lambda p: _config_only(p / "mm", "gemma3"), "multimodal Gemma 3"),
        (lambda p: _config_only(p / "yarn", rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope type 'yarn'"),
        (lambda p: _config_only(p / "gelu", hidden_act="gelu"), "hidden_act 'gelu'"),
        (lambda p: _config_only(p / "odd", intermediate_size=200), "intermediate_size = 200 is not a multiple of 32"),
        (lambda p: _config_only(p / "long", max_position_embeddings=64), "exceeds the model's max_position"),
        (lambda p: _gguf_header_only(p / "rwkv.gguf", "rwkv6"), "GGUF architecture 'rwkv6' is not supported"),
        (lambda p: _gguf_header_only(p / "y.gguf", **{"rope.scaling.type": "yarn"}), "rope scaling 'yarn'"),
    ],
)
def test_unsupported_configs_are_refused_before_any_weight_is_read(make, match, tmp_path, monkeypatch):
    """The config (config.json or the GGUF header) is checked first: no load, no precision probe,
    seconds (issue 39: a mamba config.json used to load for 36 s before its refusal)."""
    import time

    import edgespec.export.target.checks.probe as probe
    import edgespec.export.target.exporter as ex

    def never(*a, **k):
        raise AssertionError("a weight was read or the precision probe ran before the config check")

    monkeypatch.setattr(ex.sources, "load", never)
    monkeypatch.setattr(probe, "choose_precision", never)
    src = make(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises((UnsupportedModelError, ExportError), match=match):
        export(ExportConfig(target=str(src), out=str(tmp_path / "o"), max_len=128, precision="int4", progress=False))
    with pytest.raises((UnsupportedModelError, ExportError), match=match):
        export(ExportConfig(target=str(src), out=str(tmp_path / "o"), max_len=128, progress=False))  # auto
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "o").exists()


def test_cli_refuses_an_unsupported_config_in_one_line(tmp_path, capsys):
    from edgespec.cli import main

    src = _config_only(tmp_path / "mamba", "mamba")
    assert main(["export", "--target", str(src), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("edgespec export: error: model_type 'mamba'"), err


def test_existing_folder_needs_force(tiny_models, tmp_path):
    out = tmp_path / "e"
    _export(tiny_models["llama"], out)
    with pytest.raises(ExportError, match="--force"):
        _export(tiny_models["llama"], out)
    _export(tiny_models["llama"], out, force=True)
    assert load_manifest(out)


def test_interrupted_export_leaves_nothing_that_loads(tiny_models, tmp_path, monkeypatch):
    import edgespec.export.target.sources.weight_source as ws

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ws, "validate_model", boom)  # dies after the graphs and manifest are written
    monkeypatch.setattr(ws, "validate_sampled", boom)  # (the streaming export's validation)
    with pytest.raises(KeyboardInterrupt):
        _export(tiny_models["llama"], tmp_path / "e")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(tmp_path / "e")


def test_draft_with_another_tokenizer_is_refused(tiny_models, tmp_path):
    from tiny import make_tiny

    other = make_tiny("llama", tmp_path / "other", vocab_size=300)
    with pytest.raises(ExportError, match="vocab size 300 != target vocab size 256"):
        _export(tiny_models["llama"], tmp_path / "e", draft=str(other))


def test_separate_draft_model(tiny_models, tmp_path):
    from tiny import make_tiny

    other = make_tiny("llama", tmp_path / "d", seed=3, num_hidden_layers=1)
    m = load_manifest(_export(tiny_models["llama"], tmp_path / "e", draft=str(other)))
    d = m.models()["draft"]
    assert d.kind == "model" and d.weights_file == "draft.weights" and d.n_layers == 1


@pytest.mark.parametrize("graph", ["lean", "portable"])
@pytest.mark.parametrize(
    "precision, level, two_rows", [("fp32", 0, "auto"), ("int4", 4, "auto"), ("int4", 4, "on"), ("int4", 1, "on")]
)
def test_every_phase_width_computes_a_row_bitwise_alike(precision, level, two_rows, graph, tiny_models, tmp_path):
    """Batch invariance: a token's logits are the same bits in a prefill, verify or decode call
    ("on": with 1-token calls padded to 2 rows, what the export does on CPUs whose 1-row int4
    kernel sums differently, so that path runs on every machine), in both graph flavours."""
    import onnx

    m = load_manifest(
        _export(
            tiny_models["qwen2"],
            tmp_path / "e",
            precision=precision,
            int4_accuracy_level=level,
            two_row_matmuls=two_rows,
            graph=graph,
        )
    )
    assert m.target.graph.flavour == graph
    if two_rows == "on":
        ops = [n.name for n in onnx.load(m.path("target.onnx"), load_external_data=False).graph.node]
        assert m.two_row_matmuls and "/two_rows/embed" in ops and "/layers.0/attn/ctx_rows" in ops
    assert_rows_bitwise_alike(m, precision)


def test_int8_lm_head_keeps_q8_0_weights_and_is_the_int4_default(tiny_models, tmp_path):
    from edgespec.export.target.quant.quantize import quantize_int8

    # a Q8_0 tensor (blocks of 32: fp16 scale d, codes in [-127, 127], the block max at +-127)
    rng = np.random.default_rng(0)
    codes = rng.integers(-127, 128, (64, 4, 32))
    codes[:, :, 0] = 127
    d = rng.uniform(1e-3, 1e-2, (64, 4, 1)).astype(np.float16).astype(np.float32)
    w = (codes * d).reshape(64, 128).astype(np.float32)
    q, scales, zp, deq = quantize_int8(w)
    assert np.allclose(deq, w, rtol=1e-6, atol=0) and q.dtype == np.uint8 and set(zp) == {128}
    m = load_manifest(_export(tiny_models["llama"], tmp_path / "a", precision="int4"))
    assert "lm_head.q8" in m.target.weights
    assert max(m.target.validation.values()) < 3.0
    m = load_manifest(_export(tiny_models["llama"], tmp_path / "b", precision="int4", int8_lm_head=False))
    assert "lm_head.q8" not in m.target.weights
    m = load_manifest(_export(tiny_models["llama"], tmp_path / "c", precision="int4", int4_accuracy_level=0))
    assert "lm_head.q8" not in m.target.weights  # 8-bit weights need int8 activations to be fast


def test_int4_export_after_the_thread_pool_is_shared(tiny_models, tmp_path):
    """`edgespec demo` shares the ONNX Runtime pool, then exports in the same process: every
    session the export makes (the CPU probe of `--two-row-matmuls auto`, the validations) must
    run on that pool (a subprocess: the pool is process-wide)."""
    import subprocess
    import sys

    code = (
        "from edgespec.engines.ort import share_thread_pool; share_thread_pool(); "
        "from edgespec.export.target.exporter import ExportConfig, export; "
        f"export(ExportConfig(target={str(tiny_models['llama'])!r}, out={str(tmp_path / 'e')!r}, max_len=128, "
        "k=2, prefill_chunk=16, kv_bucket=32, precision='int4', progress=False))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert load_manifest(tmp_path / "e").target.precision == "int4"


def test_build_trt_records_its_engines_through_the_manifest(tiny_models, tmp_path, monkeypatch):
    """build-trt with a stand-in tensorrt: one profile per width, the shapes read from the graph's
    declared inputs (T fixed, the cache window S over [kv_bucket, max_len]), the engines recorded
    in the manifest and nothing else changed."""
    import sys
    import types

    from edgespec.engines import device
    from edgespec.engines.manifest import TrtInfo
    from edgespec.export.target.trt_build import build_trt

    folder = _export(tiny_models["llama"], tmp_path / "e", precision="fp16", draft="self:1")
    before = load_manifest(folder)
    built = {}

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            self.shapes[name] = (lo, opt, hi)

    class Config:
        def __init__(self):
            self.profiles, self.cache = [], types.SimpleNamespace(serialize=lambda: b"cache")

        def set_memory_pool_limit(self, *a):
            pass

        def create_timing_cache(self, blob):
            return self.cache

        def set_timing_cache(self, cache, ignore_mismatch):
            pass

        def get_timing_cache(self):
            return self.cache

        def add_optimization_profile(self, p):
            self.profiles.append(p)
            return len(self.profiles) - 1

    class Builder:
        def __init__(self, logger):
            self.config = Config()

        def create_network(self, flags):
            return None

        def create_builder_config(self):
            return self.config

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            built[len(built)] = config.profiles
            return b"engine"

    trt = types.SimpleNamespace(
        __version__="10.9.0",
        Logger=type("Logger", (), {"WARNING": 0, "__init__": lambda self, level: None}),
        Builder=Builder,
        NetworkDefinitionCreationFlag=types.SimpleNamespace(STRONGLY_TYPED=0),
        MemoryPoolType=types.SimpleNamespace(WORKSPACE=0),
        OnnxParser=lambda network, logger: types.SimpleNamespace(parse_from_file=lambda path: True, num_errors=0),
    )
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(device, "CudaOps", lambda: types.SimpleNamespace(device_name=lambda: "GPU T"))
    assert build_trt(folder)["profiles"] == {"1": 0, "2": 1, "3": 2, "4": 3, "16": 4}
    target, draft = built[0], built[1]
    kv = before.target.kv_width
    assert target[3].shapes == {
        "input_ids": ((1, 4),) * 3,
        "positions": ((1, 4),) * 3,
        "past_len": ((1,),) * 3,
        "tree_mask": ((4, 4),) * 3,
        "past_key_0": ((32, kv), (128, kv), (128, kv)),
        "past_value_0": ((32, kv), (128, kv), (128, kv)),
        "past_key_1": ((32, kv), (128, kv), (128, kv)),
        "past_value_1": ((32, kv), (128, kv), (128, kv)),
    }
    assert len(draft) == 2 and "tree_mask" not in draft[0].shapes and "past_key_1" not in draft[0].shapes
    after = load_manifest(folder)
    assert after.target.tensorrt == TrtInfo("target.engine", "10.9.0", "GPU T", {1: 0, 2: 1, 3: 2, 4: 3, 16: 4})
    assert after.models()["draft"].tensorrt == TrtInfo("draft.engine", "10.9.0", "GPU T", {1: 0, 16: 1})
    assert after.replace_model("target", before.target).replace_model("draft", before.models()["draft"]) == before
    assert (folder / "target.engine").read_bytes() == b"engine"


def test_every_drafter_that_ships_models_has_an_export_plugin():
    """The runtime and export registries agree: each drafter with a manifest section is exported by
    the plugin of its name; each plugin's options are ExportConfig fields, its training command a
    CLI command."""
    import dataclasses

    from edgespec.cli_offline import COMMANDS
    from edgespec.export.drafters import options, registry
    from edgespec.runtime.drafters import registry as runtime_registry

    assert set(registry()) == {n for n, s in runtime_registry().items() if s.section is not None}
    assert {o.name for o in options()} <= {f.name for f in dataclasses.fields(ExportConfig)}
    assert {f"train-{n}" for n, p in registry().items() if p.train_module} <= set(COMMANDS)
