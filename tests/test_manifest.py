"""manifest.json: typed round trips, the one writer (save), graph I/O declared once, and clear
errors for folders this edgespec cannot read (torch-free: a hand-made folder, no export)."""

import dataclasses
import json
import subprocess
import sys

import pytest

from edgespec.engines.manifest import (
    MANIFEST,
    VERSION,
    Architecture,
    Defaults,
    GraphSpec,
    HeadInfo,
    HeadsSpec,
    Manifest,
    ManifestError,
    ModelSpec,
    Source,
    TensorSpec,
    TrtInfo,
    Tuned,
    WeightSpec,
    load_manifest,
)
from edgespec.runtime.drafters.draft import DraftSection
from edgespec.runtime.drafters.eagle import EagleSection
from edgespec.runtime.drafters.medusa import MedusaSection

FILES = (
    "target.weights",
    "target.onnx",
    "eagle.weights",
    "eagle.onnx",
    "target_eagle.onnx",
    "medusa.weights",
    "medusa.onnx",
    "tokenizer.json",
)


def _graph(file: str, n_layers: int, features: bool = False, aux: int = 0) -> GraphSpec:
    inputs = [
        TensorSpec("input_ids", (1, "T"), "int64"),
        TensorSpec("positions", (1, "T"), "int64"),
        TensorSpec("past_len", (1,), "int64"),
        TensorSpec("tree_mask", ("T", "T"), "int64"),
    ]
    if features:
        inputs.append(TensorSpec("features", (1, "T", 64), "float32"))
    inputs.append(TensorSpec("past_{kind}_{layer}", ("S", 32), "float32", layers=n_layers))
    outputs = [
        TensorSpec("logits", (1, "T", 256), "float32"),
        TensorSpec("new_kv", (n_layers, 2, "T", 32), "float32"),
        TensorSpec("hidden", (1, "T", 64), "float32"),
    ]
    if aux:
        outputs.append(TensorSpec("hidden_aux", (1, "T", aux), "float32"))
    return GraphSpec(
        file, (1, 2, 3, 16), {"prefill": (16,), "decode": (1,), "verify": (2, 3)}, tuple(inputs), tuple(outputs)
    )


def _manifest(folder) -> Manifest:
    """A manifest of every model kind over empty files (the loader checks that files exist)."""
    for f in FILES:
        (folder / f).write_bytes(b"")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    w = WeightSpec("float32", (256, 64), 0, 65536)
    arch = Architecture("llama", 2, 4, 2, 16, 64, 128, 256, aux_layers=(1,))
    target = ModelSpec(
        role="target",
        kind="target",
        precision="fp32",
        arch=arch,
        kv_dtype="float32",
        weights_file="target.weights",
        weights={"embed": w},
        graph=_graph("target.onnx", 2, aux=64),
        validation={"decode_t1": 1e-7},
        tensorrt=TrtInfo("target.engine", "10.9.0", "GPU", {1: 0, 2: 1}),
    )
    draft = dataclasses.replace(
        target,
        role="draft",
        kind="self:1",
        arch=dataclasses.replace(arch, n_layers=1),
        graph=_graph("target.onnx", 1),
        tensorrt=None,
    )
    d2t = WeightSpec("int64", (48,), 64, 384, "eagle.weights")
    head = HeadInfo("heads/h", 256, 64, {"steps": 10})
    eagle = ModelSpec(
        role="eagle",
        kind="eagle",
        precision="fp32",
        arch=Architecture("llama", 1, 4, 2, 16, 64, 128, 48),
        kv_dtype="float32",
        weights_file="eagle.weights",
        weights={"fc_b": w, "embed": dataclasses.replace(w, file="target.weights")},
        graph=_graph("eagle.onnx", 1, features=True),
        d2t=d2t,
        head=head,
    )
    fused = dataclasses.replace(
        target,
        role="eagle_fused",
        kind="target+eagle",
        tensorrt=None,
        graph=dataclasses.replace(target.graph, file="target_eagle.onnx"),
    )
    medusa = HeadsSpec(
        role="medusa",
        precision="fp32",
        n_heads=3,
        n_layers=1,
        hidden_size=64,
        vocab_size=48,
        file="medusa.onnx",
        inputs=(TensorSpec("features", (1, 64), "float32"),),
        outputs=(TensorSpec("logits", (3, 48), "float32"),),
        weights_file="medusa.weights",
        weights={"lm_head_d": w},
        d2t=dataclasses.replace(d2t, file="medusa.weights"),
        head=head,
        validation={"heads": 1e-7},
    )
    tuned = Tuned("2025-01-01", None, 8, 0.1, 1.2, 50.0, "some CPU", "| table |")
    return Manifest(
        folder=folder,
        name="tiny",
        edgespec_version="0.1.0",
        created="2025-01-01T00:00:00+00:00",
        source=Source("hf", "/models/tiny", "ab12", "self:1"),
        max_len=128,
        kv_bucket=32,
        prefill_chunk=16,
        num_speculative_tokens=2,
        two_row_matmuls=True,
        tokenizer_file="tokenizer.json",
        chat_template_file="chat_template.jinja",
        eos_token_ids=(1, 2),
        bos_token_id=None,
        target=target,
        drafters={"draft": DraftSection(draft), "eagle": EagleSection(eagle, fused), "medusa": MedusaSection(medusa)},
        defaults=Defaults(k=2, adaptive=True, options={"eagle_min_confidence": 0.3}, tuned=tuned),
    )


def test_json_round_trip_is_equal(tmp_path):
    m = _manifest(tmp_path)
    d = json.loads(json.dumps(m.to_json()))  # as written to disk: tuples become lists, int keys strings
    assert Manifest.from_json(d, tmp_path) == m
    assert d["version"] == VERSION and d["target"]["tensorrt"]["profiles"] == {"1": 0, "2": 1}
    assert set(d["drafters"]) == {"draft", "eagle", "medusa"}  # one typed section per drafter that ships models
    bare = dataclasses.replace(m, drafters={}, chat_template_file=None, defaults=Defaults(k=4, adaptive=False))
    assert Manifest.from_json(json.loads(json.dumps(bare.to_json())), tmp_path) == bare


def test_save_then_load_gives_the_same_manifest(tmp_path):
    m = _manifest(tmp_path)
    assert m.save() == tmp_path / MANIFEST and not (tmp_path / (MANIFEST + ".tmp")).exists()
    back = load_manifest(tmp_path)
    assert back == m and back.chat_template == "{{ messages }}" and back.path("target.onnx") == tmp_path / "target.onnx"
    assert list(back.models()) == ["target", "draft", "eagle", "eagle_fused", "medusa"]
    # tune and build-trt: load, replace one field, save; the rest stays as it was
    dataclasses.replace(back, defaults=Defaults(k=3, adaptive=False, drafter="draft")).save()
    again = load_manifest(tmp_path)
    assert again.defaults == Defaults(k=3, adaptive=False, drafter="draft")
    assert dataclasses.replace(again, defaults=m.defaults) == m


def test_graph_io_is_declared_once_per_graph(tmp_path):
    m = _manifest(tmp_path)
    kv = m.target.graph.inputs[-1]
    assert kv.names() == ("past_key_0", "past_value_0", "past_key_1", "past_value_1")
    assert kv.shape_at(4, 64) == (64, 32) and m.target.graph.inputs[0].shape_at(4, 64) == (1, 4)
    assert m.target.graph.input_names() == (
        "input_ids",
        "positions",
        "past_len",
        "tree_mask",
        "past_key_0",
        "past_value_0",
        "past_key_1",
        "past_value_1",
    )
    assert [m.target.graph.phase(w) for w in m.target.widths()] == ["decode", "verify", "verify", "prefill"]
    with pytest.raises(ManifestError, match="no graph of width 5"):
        m.target.graph.phase(5)
    assert m.target.takes_tree and not m.target.takes_features and m.target.aux_width == 64
    eagle = m.models()["eagle"]
    assert eagle.takes_features and eagle.aux_width == 0 and eagle.kv_width == 32
    assert (m.target.n_layers, m.target.vocab_size, m.target.aux_layers) == (2, 256, (1,))


@pytest.mark.parametrize("version", [1, None])
def test_a_folder_of_an_older_edgespec_says_re_export(version, tmp_path):
    d = _manifest(tmp_path).to_json()
    if version is None:
        del d["version"]
    else:
        d["version"] = version
    (tmp_path / MANIFEST).write_text(json.dumps(d))
    with pytest.raises(
        ManifestError,
        match=r"exported by an older edgespec \(manifest version 1; this edgespec "
        rf"reads {VERSION}\)\. Hint: re-export: edgespec export --out .* --force",
    ):
        load_manifest(tmp_path)


def test_a_folder_of_a_newer_edgespec_is_refused(tmp_path):
    d = _manifest(tmp_path).to_json() | {"version": VERSION + 1}
    (tmp_path / MANIFEST).write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="exported by a newer edgespec"):
        load_manifest(tmp_path)


def test_missing_or_broken_pieces_are_named(tmp_path):
    with pytest.raises(ManifestError, match="does not exist.*edgespec export --out"):
        load_manifest(tmp_path / "nowhere")
    with pytest.raises(ManifestError, match="has no manifest.json"):
        load_manifest(tmp_path)
    m = _manifest(tmp_path)
    (tmp_path / MANIFEST).write_text("{")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "something else", "version": VERSION}))
    with pytest.raises(ManifestError, match="format 'something else'"):
        load_manifest(tmp_path)
    d = m.to_json()
    del d["target"]["graph"]
    (tmp_path / MANIFEST).write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="lacks or mistypes field 'ModelSpec.graph'"):
        load_manifest(tmp_path)
    m.save()
    (tmp_path / "eagle.onnx").unlink()  # an optional model's file: the folder loads without that model
    assert load_manifest(tmp_path).problems == {"eagle": "eagle file eagle.onnx listed in the manifest is missing"}
    (tmp_path / "target.onnx").unlink()  # the target's: an error
    with pytest.raises(ManifestError, match="target file target.onnx listed in the manifest is missing"):
        load_manifest(tmp_path)
    for f in ("eagle.onnx", "target.onnx"):
        (tmp_path / f).write_bytes(b"")
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ManifestError, match="chat_template.jinja is missing"):
        load_manifest(tmp_path)


def test_the_manifest_module_stays_torch_free():
    code = "import sys, edgespec.engines.manifest; assert 'torch' not in sys.modules and 'onnx' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_section_no_drafter_reads_is_named(tmp_path):
    """The drafter registry hands the reader its section types; a folder shipping a section no
    registered drafter reads (a newer edgespec's drafter) is refused by that name."""
    d = _manifest(tmp_path).to_json()
    d["drafters"]["toy"] = {}
    (tmp_path / MANIFEST).write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="drafter section\\(s\\) 'toy' that no registered drafter reads"):
        load_manifest(tmp_path)


def test_the_manifest_reader_imports_nothing_of_the_runtime(tmp_path):
    """engines/ sits below runtime/: reading a folder imports no runtime module; its sections are known
    once the drafter registry (runtime/drafters) is imported, which registers them."""
    _manifest(tmp_path).save()
    code = (
        "import sys\n"
        "from edgespec.engines.manifest import ManifestError, load_manifest\n"
        f"try:\n    load_manifest({str(tmp_path)!r})\nexcept ManifestError as e:\n    assert \"'draft'\" in str(e), e\n"
        "else:\n    raise AssertionError('read without the drafter registry')\n"
        "assert not [m for m in sys.modules if m.startswith('edgespec.runtime')]\n"
        "import edgespec.runtime.drafters\n"
        f"assert set(load_manifest({str(tmp_path)!r}).drafters) == {{'draft', 'eagle', 'medusa'}}\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
