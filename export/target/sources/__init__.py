"""Where a target comes from and how its weights are read.

resolve.py turns --target into a Source (an HF folder, a GGUF file, a hub id, a packaged model);
configs.py reads its config, shape, generation config and tokenizer without its weights;
weight_source.py gives its weights behind one interface (WeightSource): streamed from safetensors
(safetensors.py) or a GGUF (gguf.py, gguf_header.py) one tensor at a time, else loaded whole
through transformers (transformers.py).

The names below are the package's public face (`from edgespec.export.target import sources`).
"""

from edgespec.export.target.sources.configs import (
    ModelConfigs,
    TargetShape,
    generation_config,
    gguf_hf_config,
    load_tokenizer,
    target_config,
    target_shape,
)
from edgespec.export.target.sources.resolve import (
    DEFAULT_GGUF,
    DEFAULT_NAME,
    DEFAULT_PACKAGE,
    GGUF_KINDS,
    PACKAGED,
    PackagedModel,
    Source,
    SourceError,
    cache_dir,
    default_gguf,
    packaged_gguf,
    resolve,
    sha256_of,
)
from edgespec.export.target.sources.transformers import load

__all__ = [
    "DEFAULT_GGUF",
    "DEFAULT_NAME",
    "DEFAULT_PACKAGE",
    "GGUF_KINDS",
    "PACKAGED",
    "ModelConfigs",
    "PackagedModel",
    "Source",
    "SourceError",
    "TargetShape",
    "cache_dir",
    "default_gguf",
    "generation_config",
    "gguf_hf_config",
    "load",
    "load_tokenizer",
    "packaged_gguf",
    "resolve",
    "sha256_of",
    "target_config",
    "target_shape",
]
