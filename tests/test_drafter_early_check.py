"""The drafter checks that run before the target loads (issue 57 items 2, 3, 6-8; issue 56 item 6), on
broken copies of the published fixtures (tests/fixtures/published, tools/published_fixtures/) of
every layout: a weights file cut short after its header or shorter than one, a NaN in any tensor the
drafter reads, configs the runtime cannot run (rms_norm_eps NaN or -1, aux ids named twice, a DFlash
block past --max-len), a target-layer id naming the last layer's output, speculators' own DFlash
layout, two drafters reading different target layers, and Medusa's tied ResBlocks. Each is refused
with one line naming the file (or folder) and the problem, exit code 2, before the target loads,
and the check imports no torch. The target is a config.json alone: nothing past the check could
load it."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import one_line_error, run_cli

FIX = Path(__file__).parent / "fixtures" / "published"
NAN_BITS = {"F32": (np.uint32, 0x7FC00000), "F16": (np.uint16, 0x7E00), "BF16": (np.uint16, 0x7FC0)}


def _target(tmp_path: Path, n_layers: int) -> Path:
    """A Llama target of the fixtures' sizes (hidden 64, vocabulary 256) as config.json alone."""
    folder = tmp_path / f"target{n_layers}"
    folder.mkdir(exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": n_layers,
        "vocab_size": 256,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _copy(name: str, tmp_path: Path, config=None) -> Path:
    folder = tmp_path / name.replace("/", "-")
    shutil.copytree(FIX / name, folder)
    if config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _set(key: str, value):
    def change(cfg: dict) -> None:
        *path, last = key.split(".")
        for k in path:
            cfg = cfg[k]
        cfg[last] = value

    return change


def _cut_after_header(path: Path) -> None:
    """A file cut short: a .safetensors' header and 10 bytes of data; a zip's first half."""
    data = path.read_bytes()
    if path.suffix == ".safetensors":
        (n,) = struct.unpack("<Q", data[:8])
        path.write_bytes(data[: 8 + n + 10])
    else:
        path.write_bytes(data[: len(data) // 2])


def _nan_in(path: Path, name: str) -> None:
    """One NaN written into tensor `name` of a .safetensors file (in place) or a torch.save file."""
    if path.suffix == ".safetensors":
        data = bytearray(path.read_bytes())
        (n,) = struct.unpack("<Q", data[:8])
        entry = json.loads(data[8 : 8 + n])[name]
        raw_t, bits = NAN_BITS[entry["dtype"]]
        at = 8 + n + entry["data_offsets"][0]
        data[at : at + np.dtype(raw_t).itemsize] = np.array([bits], raw_t).tobytes()
        path.write_bytes(bytes(data))
        return
    import torch

    sd = torch.load(path, weights_only=True)
    sd[name] = sd[name].clone()
    sd[name].view(-1)[0] = float("nan")
    torch.save(sd, path)


def _refused(capsys, target: Path, tmp_path: Path, *drafters) -> str:
    """The export's one-line refusal (exit code 2, no folder left; before the target loads: the callers'
    target is a bare config.json, and speed lives in benchmarks, not timed tests)."""
    args = ["export", "--target", target, "--max-len", "128", "--out", tmp_path / "out", *drafters]
    rc, err = run_cli(capsys, *args)
    line = one_line_error(err, "export")
    assert rc == 2, err
    assert not (tmp_path / "out").exists()
    return line


# layout fixture, its flag, its target's depth, its weights file, a float tensor it reads
LAYOUTS = {
    "eagle1-official/fp16": ("--eagle", 8, "pytorch_model.bin", "fc.weight"),
    "eagle3-official": ("--eagle3-head", 8, "pytorch_model.bin", "fc.weight"),
    "eagle3-specforge": ("--eagle3-head", 8, "model.safetensors", "midlayer.mlp.up_proj.weight"),
    "eagle3-speculators": ("--eagle3-head", 8, "model.safetensors", "layers.0.self_attn.q_proj.weight"),
    "dflash-zlab-llama-bf16": ("--dflash", 6, "model.safetensors", "layers.1.mlp.down_proj.weight"),
    "medusa-official-pt-fp16": ("--medusa", 8, "medusa_lm_head.pt", "1.0.linear.weight"),
    "medusa-official-st-bf16": ("--medusa", 8, "medusa_lm_head.safetensors", "2.1.weight"),
    "medusa-official-publish/heads": ("--medusa", 8, "model.safetensors", "0.0.linear.bias"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_file_cut_short_after_its_header_is_refused_naming_it(layout, tmp_path, capsys, target_never_loads):
    flag, depth, file, _ = LAYOUTS[layout]
    folder = _copy(layout, tmp_path)
    _cut_after_header(folder / file)
    line = _refused(capsys, _target(tmp_path, depth), tmp_path, flag, folder)
    assert str(folder / file) in line and "cut short" in line, line


@pytest.mark.parametrize("layout", [k for k, v in LAYOUTS.items() if v[2].endswith(".safetensors")])
def test_a_file_shorter_than_a_header_is_one_line(layout, tmp_path, capsys, target_never_loads):
    flag, depth, file, _ = LAYOUTS[layout]
    folder = _copy(layout, tmp_path)
    (folder / file).write_bytes(b"\x10\x00\x00")
    line = _refused(capsys, _target(tmp_path, depth), tmp_path, flag, folder)
    assert str(folder / file) in line and "3 bytes, less than a safetensors header" in line, line


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_nan_in_a_tensor_is_refused_naming_tensor_and_file(layout, tmp_path, capsys, target_never_loads):
    flag, depth, file, tensor = LAYOUTS[layout]
    folder = _copy(layout, tmp_path)
    _nan_in(folder / file, tensor)
    line = _refused(capsys, _target(tmp_path, depth), tmp_path, flag, folder)
    assert f"{folder / file}: tensor {tensor} holds 1 NaN value(s)" in line, line


def test_a_nan_medusa_resblock_gets_the_nan_reason(tmp_path, capsys, target_never_loads):
    """Medusa's tied ResBlocks are compared before the target loads too; a NaN is said as a NaN."""
    folder = _copy("medusa-official-pt-fp32-l2", tmp_path)
    _nan_in(folder / "medusa_lm_head.pt", "0.1.linear.weight")
    line = _refused(capsys, _target(tmp_path, 8), tmp_path, "--medusa", folder)
    assert "tensor 0.1.linear.weight holds 1 NaN" in line and "ResBlocks" not in line, line

    import torch

    folder = _copy("medusa-official-pt-fp32-l2", tmp_path / "differ")
    sd = torch.load(folder / "medusa_lm_head.pt", weights_only=True)
    sd["0.1.linear.bias"] = sd["0.1.linear.bias"] + 1
    torch.save(sd, folder / "medusa_lm_head.pt")
    line = _refused(capsys, _target(tmp_path, 8), tmp_path, "--medusa", folder)
    assert "head 0's ResBlocks [0, 1] hold different biases" in line, line


EPS_KEYS = {
    "eagle1-official/fp16": ("--eagle", 8, "rms_norm_eps"),
    "eagle3-speculators": ("--eagle3-head", 8, "transformer_layer_config.rms_norm_eps"),
    "eagle3-specforge": ("--eagle3-head", 8, "rms_norm_eps"),
    "dflash-zlab-llama-bf16": ("--dflash", 6, "rms_norm_eps"),
}


@pytest.mark.parametrize("eps", [float("nan"), -1.0])
@pytest.mark.parametrize("layout", EPS_KEYS)
def test_an_eps_rmsnorm_cannot_use_is_refused(layout, eps, tmp_path, capsys, target_never_loads):
    flag, depth, key = EPS_KEYS[layout]
    folder = _copy(layout, tmp_path, _set(key, eps))
    line = _refused(capsys, _target(tmp_path, depth), tmp_path, flag, folder)
    assert str(folder) in line and f"rms_norm_eps {eps!r} is not a finite number > 0" in line, line


@pytest.mark.parametrize(
    "layout, ids, says",
    [
        ("eagle3-speculators", [2, 2, 2], "aux layer ids [2, 2, 2] name layer(s) [2] more than once"),
        ("eagle3-specforge", [1, 3, 1], "aux layer ids [1, 3, 1] name layer(s) [1] more than once"),
        ("eagle3-speculators", [2, 4, 8], "the last layer's output (speculators' --include-last-layer)"),
    ],
)
def test_aux_ids_the_graphs_cannot_give_are_refused(layout, ids, says, tmp_path, capsys, target_never_loads):
    key = "eagle_aux_hidden_state_layer_ids" if layout.endswith("speculators") else "eagle_config"
    value = ids if layout.endswith("speculators") else {"eagle_aux_hidden_state_layer_ids": ids}
    folder = _copy(layout, tmp_path, _set(key, value))
    line = _refused(capsys, _target(tmp_path, 8), tmp_path, "--eagle3-head", folder)
    assert str(folder) in line and says in line, line
    assert "another model" not in line


def test_a_dflash_block_past_max_len_is_refused(tmp_path, capsys, target_never_loads):
    folder = _copy("dflash-zlab-llama-bf16", tmp_path, _set("block_size", 1_000_000_000))
    line = _refused(capsys, _target(tmp_path, 6), tmp_path, "--dflash", folder)
    assert "block_size 1000000000 exceeds --max-len 128" in line, line


def test_speculators_dflash_layout_is_said_unsupported(tmp_path, capsys, target_never_loads):
    """speculators' DFlash config (its class writes DFlashDraftModel too): the layout is named, not its keys."""

    def speculators(cfg: dict) -> None:
        layer = {k: cfg.pop(k) for k in list(cfg) if k not in ("architectures", "block_size", "dflash_config")}
        cfg.update(
            speculators_model_type="dflash",
            speculators_version="0.9.0",
            transformer_layer_config=layer,
            aux_hidden_state_layer_ids=cfg.pop("dflash_config")["target_layer_ids"],
            speculators_config={"algorithm": "dflash", "verifier": {"name_or_path": None}},
        )

    folder = _copy("dflash-zlab-llama-bf16", tmp_path, speculators)
    line = _refused(capsys, _target(tmp_path, 6), tmp_path, "--dflash", folder)
    assert "speculators' DFlash layout" in line and "is not supported" in line and "DFlashDraftModel" in line
    assert "remove them" not in line and "unknown" not in line


def test_two_drafters_reading_different_layers_are_refused_before_the_target_loads(
    tmp_path, capsys, target_never_loads
):
    eagle3 = _copy("eagle3-speculators", tmp_path, _set("eagle_aux_hidden_state_layer_ids", [1, 2, 3]))
    dflash = FIX / "dflash-zlab-llama-bf16"  # target_layer_ids [1, 3]: the streams entering 2, 4
    line = _refused(capsys, _target(tmp_path, 6), tmp_path, "--eagle3-head", eagle3, "--dflash", dflash)
    assert "read the target's features at different layers" in line and "[1, 2, 3]" in line and "[2, 4]" in line


def test_the_early_check_imports_no_torch(tmp_path):
    """`edgespec export` refusing a broken drafter in a fresh interpreter: exit code 2, one line, and
    neither torch nor transformers imported (the refusal costs an interpreter start, not torch's)."""
    folder = _copy("eagle3-speculators", tmp_path)
    _nan_in(folder / "model.safetensors", "fc.weight")
    cut = _copy("dflash-zlab-llama-bf16", tmp_path)
    _cut_after_header(cut / "model.safetensors")
    script = (
        "import sys\n"
        "from edgespec.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'\n"
        "sys.exit(rc)\n"
    )
    for flag, head, target in (
        ("--eagle3-head", folder, _target(tmp_path, 8)),
        ("--dflash", cut, _target(tmp_path, 6)),
    ):
        cmd = [sys.executable, "-c", script, "export", "--target", str(target), "--max-len", "128"]
        p = subprocess.run([*cmd, flag, str(head), "--out", str(tmp_path / "o")], capture_output=True, text=True)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and str(head) in lines[0], p.stderr
