"""Issue 38 across every published layout: each has its fixture (written by the upstream project's own
code, tools/published_fixtures/) and its test module (tests/test_published_<kind>.py: export, parity
with the upstream forward, lossless greedy); here, what holds for all of them with the real default
target: a drafter folder that cannot fit it is refused before the target loads, in seconds, with one
line and no traceback, whatever the flag it is given to."""

import time
from pathlib import Path

import pytest
from helpers.cli import one_line_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "published"
# layout id -> the export flag a user passes it to
LAYOUTS = {
    "eagle1-official": "--eagle",
    "eagle3-official": "--eagle3-head",
    "eagle3-specforge": "--eagle3-head",
    "eagle3-speculators": "--eagle3-head",
    "dflash-zlab": "--dflash",
    "medusa-official": "--medusa",
}
FLAGS = sorted(set(LAYOUTS.values()))


def _checkpoints(layout: str) -> list[Path]:
    """The fixture's checkpoint folders (those holding a config.json; dtype variants are several)."""
    return sorted(p.parent for p in FIXTURES.glob(f"{layout}*/**/config.json"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_has_a_fixture_and_a_test_module(layout):
    assert _checkpoints(layout), f"no fixture for {layout} under {FIXTURES} (tools/published_fixtures/)"
    kind = layout.split("-")[0]
    assert (Path(__file__).parent / f"test_published_{kind}.py").exists()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_tiny_head_with_the_default_target_is_refused_before_it_loads(layout, tmp_path, capsys, target_never_loads):
    """The fixtures are heads for hidden size 64; the default model's is 576: refused by the checks
    that read config.json and the tensors' shapes, before any weight of the target."""
    folder = _checkpoints(layout)[0]
    t0 = time.perf_counter()
    rc, err = run_cli(capsys, "export", "--out", tmp_path / "out", LAYOUTS[layout], folder)
    took = time.perf_counter() - t0
    line = one_line_error(err, "export")
    assert rc == 2 and str(folder) in line and "576" in line, line
    assert took < 10, f"refused after {took:.1f} s"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize(
    "broken",
    [
        "empty",
        "config_only",
        "not_json",
        "no_weights_of_its_kind",
    ],
)
def test_a_broken_folder_is_one_line_before_the_target_loads(flag, broken, tmp_path, capsys, target_never_loads):
    folder = tmp_path / "head"
    folder.mkdir()
    if broken == "config_only":
        (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 576}')
    elif broken == "not_json":
        (folder / "config.json").write_text("{not json")
        (folder / "model.safetensors").write_bytes(b"\0" * 16)
    elif broken == "no_weights_of_its_kind":
        import numpy as np
        from safetensors.numpy import save_file

        (folder / "config.json").write_text('{"hidden_size": 576, "vocab_size": 49152}')
        save_file({"something.else": np.zeros((2, 2), np.float32)}, str(folder / "model.safetensors"))
    t0 = time.perf_counter()
    rc, err = run_cli(capsys, "export", "--out", tmp_path / "out", flag, folder)
    line = one_line_error(err, "export")
    assert rc == 2 and str(folder) in line, line
    assert time.perf_counter() - t0 < 10
