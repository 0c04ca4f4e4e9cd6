"""edgespec: speculative decoding for LLMs on one edge device.

`edgespec.export` (offline, torch) writes engine folders; `edgespec.runtime` (lean, numpy +
onnxruntime) runs them. `from edgespec import Generator` is the entry point of the Python API.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Generator":  # lazy: `import edgespec` stays cheap and torch-free
        from edgespec.runtime.generator import Generator

        return Generator
    if name == "RuntimeConfig":
        from edgespec.runtime.config import RuntimeConfig

        return RuntimeConfig
    raise AttributeError(name)
