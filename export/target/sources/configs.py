"""What the export reads of a model besides its weights, without loading it: its config (from
config.json or a GGUF header: target_config, gguf_hf_config), its shape (target_shape), its
generation config and tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.export.target.sources.resolve import GGUF_KINDS, Source, SourceError


def load_tokenizer(source: Source):
    """The tokenizer of an HF folder or a GGUF alone, as `load` loads it (the streaming export
    loads no model)."""
    from transformers import AutoTokenizer

    try:
        if source.kind in GGUF_KINDS:
            p = Path(source.path)
            return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        return AutoTokenizer.from_pretrained(source.path)
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(f"could not load the tokenizer of {source.path}: {e}") from e


@dataclass(frozen=True)
class ModelConfigs:
    """What the export reads of a loaded model besides its weights, without loading it."""

    config: object  # its transformers config
    generation_config: object  # its GenerationConfig, as from_pretrained gives a model


def generation_config(source: Source, hf_cfg) -> ModelConfigs:
    """An HF folder's (or a GGUF's) generation config as transformers gives a model loaded from it:
    generation_config.json where there is one (a GGUF: beside it), else made from the model config."""
    from transformers import GenerationConfig

    folder = Path(source.path).parent if source.kind in GGUF_KINDS else Path(source.path)
    if (folder / "generation_config.json").exists():
        gen = GenerationConfig.from_pretrained(str(folder))
    else:
        gen = GenerationConfig.from_model_config(hf_cfg)
    return ModelConfigs(hf_cfg, gen)


_GGUF_CONFIGS: dict[tuple, object] = {}  # (path, size, mtime) -> its config, read once a process


def gguf_hf_config(source: Source):
    """A GGUF's transformers config as `load` gets it (AutoConfig with gguf_file: its whole header
    read by gguf's reader, seconds; no tensor read), for the streaming export, whose graphs must be
    the ones the loaded model's config gives. Read once per file (unchanged) and process: the
    precision probe's candidates and the export ask for it in turn (the vocabulary's walk took
    20 s each on a 128k-token GGUF, under load); each caller gets its own copy."""
    import copy

    from transformers import AutoConfig

    p = Path(source.path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        if key not in _GGUF_CONFIGS:
            _GGUF_CONFIGS.clear()  # the last file's alone
            _GGUF_CONFIGS[key] = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
        return copy.deepcopy(_GGUF_CONFIGS[key])
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(f"could not read the config of {source.path}: {e}") from e


GGUF_ROPE_TYPES = {"none": "default", "linear": "linear"}  # {arch}.rope.scaling.type -> the HF rope type


def target_config(source: Source):
    """The target's Hugging Face config from config.json or the GGUF header alone (seconds, no
    weights or vocabulary read): what `arch.arch_from_config` checks before the export loads
    anything. A GGUF's is made as transformers' GGUF loader makes it (its key mapping), plus the
    rope scaling type that loader does not read (a yarn GGUF would load as plain rope). None for a
    hub id that cannot be reached (the load says why). A model_type or GGUF architecture outside
    edgespec's families is an UnsupportedModelError naming it."""
    import json

    from edgespec.export.target.families import MODEL_TYPES, UnsupportedModelError

    hint = f"edgespec exports {', '.join(MODEL_TYPES)} (Llama-family decoders). Hint: convert the model to one of these"
    if source.kind in GGUF_KINDS:
        return _gguf_config(source, hint)
    if source.kind == "hf":
        try:
            raw = json.loads((Path(source.path) / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise SourceError(f"{source.path}/config.json cannot be read: {e}") from e
        mt = raw.get("model_type") if isinstance(raw, dict) else None
        if mt not in MODEL_TYPES + ("gemma3",):  # gemma3: arch_from_config says what to export instead
            raise UnsupportedModelError(f"model_type {mt!r} ({source.path}/config.json) is not supported; {hint}.")
    from huggingface_hub.errors import StrictDataclassError  # transformers' config validators raise it
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source.path)
    except OSError:
        if source.kind == "hub":
            return None  # offline or gated: the load reports it
        raise
    except (ValueError, KeyError) as e:  # transformers does not know the model_type
        raise UnsupportedModelError(f"{source.path}: {e} {hint}") from e
    except StrictDataclassError as e:  # a config transformers itself refuses (odd rotary width, ...)
        cause = " ".join(str(e.__cause__ or e).split())
        raise UnsupportedModelError(f"{source.path}: the model's config is inconsistent: {cause}") from e


def _gguf_config(source: Source, hint: str):
    """An HF config from a GGUF header (target_config)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig
    from transformers.integrations import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    from edgespec.export.target.families import UnsupportedModelError, gguf_family
    from edgespec.export.target.sources.gguf_header import LongArray, read_header

    h = read_header(source.path)
    arch = h.architecture
    fam = gguf_family(arch, str(h.get("general.name", "")))
    keys = GGUF_CONFIG_MAPPING.get(fam.gguf_arch) if fam else None
    if keys is None:
        raise UnsupportedModelError(f"{source.path}: GGUF architecture {arch!r} is not supported; {hint}.")
    mt = fam.model_type
    rope = str(h.arch_value("rope.scaling.type", "none"))
    if rope not in GGUF_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{source.path}: rope scaling {rope!r} is not supported (only {', '.join(GGUF_ROPE_TYPES)}); "
            "Hint: export a GGUF without rope scaling, or the model's HF folder"
        )
    params = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(mt, {}))
    for key, hf_key in keys.items():
        value = h.arch_value(key)
        if hf_key not in (None, -1) and value is not None and not isinstance(value, LongArray | list):
            params[hf_key] = value
    if "vocab_size" not in params:  # as transformers does: the vocabulary's length
        tokens = h.get("tokenizer.ggml.tokens")
        params["vocab_size"] = tokens.length if isinstance(tokens, LongArray) else len(tokens or [])
    params["tie_word_embeddings"] = all(t.name != "output.weight" for t in h.tensors)
    if rope == "linear":
        params["rope_scaling"] = {"rope_type": "linear", "factor": float(h.arch_value("rope.scaling.factor", 1.0))}
    try:
        return AutoConfig.for_model(mt, **params)
    except (ValueError, TypeError, StrictDataclassError) as e:
        cause = " ".join(str(e.__cause__ or e).split())
        raise UnsupportedModelError(f"{source.path}: the GGUF header gives an inconsistent config: {cause}") from e


@dataclass(frozen=True)
class TargetShape:
    """What a drafter checkpoint is checked against before the target's weights load: its config's
    numbers, read from config.json or the GGUF header (no weights read)."""

    model_type: str  # HF model_type (GGUF: general.architecture, e.g. "llama", "qwen2", "gemma3")
    hidden_size: int  # residual stream width
    vocab_size: int  # LM head rows
    n_layers: int  # decoder layers
    rope_theta: float  # RoPE base (10000 when the config leaves it unset)
    n_kv_heads: int = 0  # key/value heads (0: not read)
    head_dim: int = 0  # per-head width (0: not read)
    context: int = 0  # the model's own context: max_position_embeddings / GGUF context_length (0: unsaid)
    dtype: str = ""  # a safetensors checkpoint's parameter dtype as its config names it ("bfloat16"; "": unsaid)


def target_shape(source: Source) -> TargetShape | None:
    """The target's shape from its config alone (seconds, no weights); None for a hub id (nothing
    local to read until it downloads)."""
    import json

    if source.kind == "hub":
        return None
    if source.kind == "hf":
        cfg = json.loads((Path(source.path) / "config.json").read_text())
        cfg = cfg.get("text_config") or cfg  # multimodal wrappers (Gemma 3) keep the LM's numbers here
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        n_heads = int(cfg.get("num_attention_heads") or 1)
        return TargetShape(
            model_type=str(cfg.get("model_type", "")),
            hidden_size=int(cfg["hidden_size"]),
            vocab_size=int(cfg["vocab_size"]),
            n_layers=int(cfg["num_hidden_layers"]),
            rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads),
            context=int(cfg.get("max_position_embeddings") or 0),
            dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or ""),
        )
    from edgespec.export.target.sources.gguf_header import LongArray, read_header

    h = read_header(source.path)  # no GGUFReader: it takes seconds on a large vocabulary
    tokens = h.get("tokenizer.ggml.tokens")
    vocab = h.arch_value("vocab_size") or (tokens.length if isinstance(tokens, LongArray) else len(tokens or []))
    return TargetShape(
        model_type=h.architecture,
        hidden_size=int(h.arch_value("embedding_length")),
        vocab_size=int(vocab),
        n_layers=int(h.arch_value("block_count")),
        rope_theta=float(h.arch_value("rope.freq_base", 10000.0)),
        n_kv_heads=int(h.arch_value("attention.head_count_kv") or h.arch_value("attention.head_count") or 0),
        head_dim=int(
            h.arch_value("attention.key_length")
            or int(h.arch_value("embedding_length")) // max(1, int(h.arch_value("attention.head_count") or 1))
        ),
        context=int(h.arch_value("context_length") or 0),
    )
