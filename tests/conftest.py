import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """HF folders of tiny random llama / qwen2 / qwen3 / mistral models."""
    pytest.importorskip("torch")
    from tiny import make_tiny

    root = tmp_path_factory.mktemp("tiny_models")
    return {mt: make_tiny(mt, root / mt) for mt in ("llama", "qwen2", "qwen3", "mistral")}


@pytest.fixture(scope="session")
def tiny_engine(tiny_models, tmp_path_factory):
    """An engine folder: tiny llama target + a self:1 draft, k up to 8."""
    from tiny import TINY_EXPORT

    from edgespec.export.target.exporter import ExportConfig, export

    out = tmp_path_factory.mktemp("engines") / "tiny-llama"
    return export(ExportConfig(target=str(tiny_models["llama"]), draft="self:1", out=str(out), **TINY_EXPORT))


@pytest.fixture(scope="session")
def default_engine(tmp_path_factory):
    """The real default model (SmolLM2-135M-Instruct), exported once per test session.

    EDGESPEC_TEST_ENGINE points at an existing folder to skip the export (developer machines).
    """
    pytest.importorskip("torch")
    from edgespec.export.target.exporter import ExportConfig, export

    if os.environ.get("EDGESPEC_TEST_ENGINE"):
        return Path(os.environ["EDGESPEC_TEST_ENGINE"])
    out = tmp_path_factory.mktemp("engines") / "smollm2"
    # int4: what these tests check (ExportConfig's default, auto, would time int4 and int8 here and keep either)
    return export(
        ExportConfig(out=str(out), draft="self:8", max_len=1024, k=8, precision="int4", trees=True, progress=False)
    )


@pytest.fixture
def target_never_loads(monkeypatch):
    """Loading (or probing) the target fails the test: a drafter folder's refusal must come before it."""
    from edgespec.export.target import sources
    from edgespec.export.target.checks import probe

    def no(*_a, **_k):
        raise AssertionError("the target was loaded (or probed) before the drafter folder was checked")

    monkeypatch.setattr(sources, "load", no)
    monkeypatch.setattr(probe, "choose_precision", no)


@pytest.fixture
def own_thread_pools(monkeypatch):
    """main() would make this test process share one ORT pool, changing how later tests' sessions run
    (modules that call edgespec's main() in-process use it: pytestmark = usefixtures(...))."""
    import edgespec.engines.ort as eo

    monkeypatch.setattr(eo, "share_thread_pool", lambda threads=None: 0)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by selenium (skipped where either is missing)."""
    from helpers.browser import chromium

    with chromium() as driver:
        yield driver
