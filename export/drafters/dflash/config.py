"""config.json of the DFlash layout (`dflash-zlab`; layout.py reads the tensors): what it may hold,
read into `DFlashConfig` (`parse_config`) and written back (`zlab_config`).

config.json is read as z-lab's class reads it: through transformers' Qwen3Config (a field left out
takes Qwen3Config's default, whatever model_type says), and the drafter's own values looked up in
`dflash_config` first, then at the top level (z-lab's `_draft_value`):
  block_size             b, the rows of one drafting call (the anchor + b-1 masks). Required: z-lab's
                         class assumes 16 when it is absent, but a drafter is trained for one b
  mask_token_id          the token whose (target) embedding fills the rows to draft. Required
  target_layer_ids       the target layers whose features fc reads, one block of fc's columns each;
                         absent: z-lab's rule from num_target_layers and num_hidden_layers
  input_embedding_scale  the block rows' embeddings times this (1)
  output_multiplier      the logits times this (1)
  final_logit_softcapping  > 0: logits = c tanh(logits / c) (none)
The drafter's own RoPE (rope_parameters, or rope_theta + rope_scaling as transformers 4 wrote them:
default, linear or llama3) rotates its queries and keys, never the target's. Refused with the
reason: DFlash2DraftModel (convolutions and a candidate selector), sliding_attention layers,
is_causal true, other activations or rope types, a partial rotary factor, keys this reader does not
know (dflash_config's, or top-level ones that are not Qwen3Config's), a target layer id the target's
graphs cannot output (layout.py says which), a config made for another target (its width,
vocabulary, depth).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.export.drafters._files import HF_INERT, eps_problem, unknown_keys
from edgespec.export.target.arch import ROPE_TYPES
from edgespec.export.train.checkpoint import CheckpointError

# transformers' Qwen3Config defaults: what z-lab's class computes with when config.json leaves a field out
QWEN3_DEFAULTS = {
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "rope_theta": 10000.0,
}
# the fields that shape its tensors and norms (null: refused, z-lab's class cannot build it)
SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "rms_norm_eps",
)
# z-lab's own values (dflash_config first, then the top level) this reader honours
DRAFT_KEYS = (
    "block_size",
    "mask_token_id",
    "target_layer_ids",
    "input_embedding_scale",
    "output_multiplier",
    "final_logit_softcapping",
)
# top-level keys that change nothing the drafter computes (bookkeeping, training-only, checked elsewhere)
INERT_KEYS = HF_INERT | {
    "max_position_embeddings",  # read by dynamic rope types only (refused)
    "tie_word_embeddings",  # the drafter has no embedding or LM head of its own
    "vocab_size",  # checked against the target's
    "num_target_layers",  # checked against the target's, and z-lab's rule when target_layer_ids is absent
    "draft_vocab_size",  # edgespec's layout: the d2t tensor's length
    "edgespec",  # edgespec's training record
    "dflash_config",
}
# the rope parameters each type reads besides theta (transformers' rope initializers)
ROPE_PARAMS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
HINT = "Hint: pass a DFlash drafter folder (z-lab's DFlashDraftModel, or `edgespec train-dflash --out DIR`)"


class DFlashFormatError(CheckpointError):
    """A DFlash checkpoint that is not in the expected layout or does not fit the target."""


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int  # H: the target's hidden size (the drafter's width)
    n_layers: int  # drafter decoder layers
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # per-head width
    intermediate_size: int  # MLP width
    rms_norm_eps: float  # RMSNorm epsilon
    rope_theta: float  # the drafter's own rotary base (its config's; edgespec's drafters: the target's)
    vocab_size: int  # target vocabulary
    draft_vocab_size: int  # tokens it can propose (the most frequent answer tokens; z-lab's: all)
    block_size: int  # b: rows per call (the anchor + b-1 drafted tokens)
    mask_token_id: int  # the id whose (target) embedding fills the rows to draft
    target_layer_ids: tuple[int, ...]  # z-lab's convention: target layers whose OUTPUT is read, ascending, once each
    n_target_layers: int  # the target's depth (0: not recorded)
    rope_type: str = "default"  # its RoPE scaling: "default" | "linear" | "llama3"
    rope_params: tuple = ()  # sorted (key, value) pairs of the scaling's parameters (ArchSpec.rope_params)
    attention_bias: bool = False  # q/k/v/o projections carry biases
    embed_scale: float = 1.0  # the block rows' embeddings times this (z-lab's input_embedding_scale)
    logit_scale: float = 1.0  # logits times this (z-lab's output_multiplier)
    logit_softcap: float = 0.0  # > 0: logits = c tanh(logits / c) (z-lab's final_logit_softcapping)

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The target layers whose ENTERING stream it reads (GraphOptions.aux_layers' ids): each id + 1."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @classmethod
    def of_target(cls, arch, n_layers: int, draft_vocab: int, block_size: int, mask_token_id: int) -> DFlashConfig:
        """A new drafter's: the target's layer shapes and RoPE (its ArchSpec names them as this config
        does), reading the features of the aux layers (spec.aux_layers; their outputs, in DFlash's terms)."""
        from edgespec.export.target.spec import aux_layers

        same = ("hidden_size", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "rms_norm_eps", "vocab_size")
        return cls(
            **{f: getattr(arch, f) for f in same},
            n_layers=n_layers,
            rope_theta=float(arch.rope_theta),
            draft_vocab_size=draft_vocab,
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=tuple(ly - 1 for ly in aux_layers(arch.n_layers)),
            n_target_layers=arch.n_layers,
            rope_type=arch.rope_type,
            rope_params=tuple(arch.rope_params),
        )


def zlab_layer_ids(n_target_layers: int, n_draft_layers: int) -> list[int]:
    """z-lab's target_layer_ids when a config names none (`build_target_layer_ids`): the middle layer
    for one draft layer, else n_draft ids spread evenly over 1 .. n_target-3, rounded half to even."""
    if n_draft_layers == 1:
        return [n_target_layers // 2]
    span = n_target_layers - 4  # from layer 1 to layer n_target - 3
    return [round(1 + i * span / (n_draft_layers - 1)) for i in range(n_draft_layers)]


def fail(folder: Path, reason: str, hint: str = "") -> DFlashFormatError:
    return DFlashFormatError(f"{folder}: {reason}" + (f". {hint}" if hint else ""))


def _draft_value(cfg: dict, name: str, folder: Path):
    """z-lab's lookup: dflash_config first, then the top level; two different values are refused."""
    dc = cfg.get("dflash_config") or {}
    if name in dc and name in cfg and dc[name] != cfg[name]:
        raise fail(
            folder,
            f"config.json gives {name} twice: {dc[name]} in dflash_config and {cfg[name]} at the top level "
            "(z-lab's class takes dflash_config's, other loaders may not)",
            "Hint: keep the one the drafter was trained with",
        )
    return dc.get(name, cfg.get(name))


def _rope(cfg: dict, folder: Path) -> tuple[float, str, tuple]:
    """(theta, type, parameters) of the drafter's own RoPE: rope_parameters (transformers 5), or
    rope_theta + rope_scaling (transformers 4); refused: types and parameters the tables do not compute."""
    params = dict(cfg.get("rope_parameters") or {}) | dict(cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or QWEN3_DEFAULTS["rope_theta"])
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    partial = float(params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
    if kind not in ROPE_TYPES:
        raise fail(folder, f"rope type {kind!r} is not supported (only {', '.join(ROPE_TYPES)})")
    if partial != 1.0:
        raise fail(folder, f"partial_rotary_factor {partial} is not supported (every query/key dimension rotates)")
    missing = [k for k in ROPE_PARAMS[kind] if k not in params]
    unknown = sorted(set(params) - set(ROPE_PARAMS[kind]))
    if missing or unknown:
        raise fail(
            folder,
            f"rope type {kind!r} " + (f"lacks {missing}" if missing else f"has parameters {unknown} it does not read"),
        )
    odd = {k: v for k, v in params.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
    if odd:
        raise fail(folder, f"rope parameters {odd} are not numbers")
    return theta, kind, tuple(sorted(params.items()))


def _checked_config(cfg: dict, folder: Path) -> dict:
    """config.json's values as z-lab's class computes with them (Qwen3Config defaults filled in);
    the architecture, attention kinds and unknown keys checked."""
    arch = cfg.get("architectures") or []
    if cfg.get("speculators_model_type") or "speculators_config" in cfg or "transformer_layer_config" in cfg:
        kind = cfg.get("speculators_model_type") or "a speculators model"
        raise fail(
            folder,
            f"a vLLM speculators checkpoint ({kind!r}, architectures {arch}): speculators' DFlash layout "
            "(transformer_layer_config, speculators_config) is not supported; --dflash reads z-lab's "
            "DFlashDraftModel layout (package dflash) and `edgespec train-dflash`'s",
            "Hint: use the drafter's z-lab release, or train one with `edgespec train-dflash`",
        )
    if "DFlash2DraftModel" in arch:
        raise fail(
            folder,
            "a DFlash2DraftModel (grouped dynamic convolutions and a candidate selector around each layer): "
            "edgespec's DFlash graph computes DFlashDraftModel only",
            "Hint: use the drafter's DFlash (version 1) release",
        )
    if "DFlashDraftModel" not in arch:
        raise fail(folder, f"config.json is not a DFlash drafter's (architectures {arch}, not DFlashDraftModel)", HINT)
    rope = {"layer_types", "is_causal", "rope_parameters", "rope_scaling", "partial_rotary_factor"}
    unknown = sorted(unknown_keys(cfg, INERT_KEYS, QWEN3_DEFAULTS, DRAFT_KEYS, rope))
    unknown += [f"dflash_config.{k}" for k in sorted(set(cfg.get("dflash_config") or {}) - set(DRAFT_KEYS))]
    if unknown:
        raise fail(
            folder,
            f"config.json has {unknown}, which edgespec's DFlash reader does not know (they may change what "
            "the drafter computes)",
            "Hint: remove them if they do not",
        )
    c = QWEN3_DEFAULTS | cfg
    if c["num_key_value_heads"] is None:  # Qwen3Config: None means one KV head per query head
        c["num_key_value_heads"] = c["num_attention_heads"]
    null = [k for k in SHAPE_KEYS if c[k] is None]
    if null:
        raise fail(folder, f"config.json sets {null} to null (z-lab's class cannot build the drafter)")
    n = int(c["num_hidden_layers"])
    window = c["sliding_window"] if c["use_sliding_window"] else None  # Qwen3Config drops it otherwise
    kinds = cfg.get("layer_types") or [
        "sliding_attention" if window is not None and i >= (c["max_window_layers"] or 0) else "full_attention"
        for i in range(n)
    ]
    sliding = [i for i, k in enumerate(kinds[:n]) if k != "full_attention"]
    if sliding or len(kinds) < n:
        raise fail(
            folder,
            f"layers {sliding or kinds} are not full_attention ({sorted(set(kinds))}): edgespec's DFlash graph "
            "lets every block row attend to the whole context and block",
        )
    if cfg.get("is_causal"):
        raise fail(
            folder, "is_causal is true (block rows see only earlier rows): edgespec's DFlash graph is not causal"
        )
    if c["hidden_act"] != "silu":
        raise fail(folder, f"hidden_act {c['hidden_act']!r} is not supported (only silu SwiGLU MLPs)")
    return c


def _block_and_mask(raw: dict, folder: Path, vocab: int) -> tuple:
    """(block_size, mask_token_id) as config.json names them, checked."""
    block = _draft_value(raw, "block_size", folder)
    if block is None:
        raise fail(
            folder,
            "config.json names no block_size (z-lab's class would assume 16; a drafter is trained for one)",
            'Hint: add "block_size": N, the block it was trained with',
        )
    if int(block) < 2:
        raise fail(folder, f"block_size {block}: a block holds the anchor and at least one draft")
    mask = _draft_value(raw, "mask_token_id", folder)
    if mask is None or not 0 <= int(mask) < (vocab or int(mask) + 1):
        raise fail(folder, f"mask_token_id {mask} is not a token of the target's vocabulary (0..{vocab - 1})")
    return block, mask


def _layer_ids(raw: dict, folder: Path, n_draft_layers: int, n_target: int, n_layers: int | None) -> tuple[int, ...]:
    """target_layer_ids as stored (z-lab's rule where only num_target_layers is given), each a layer
    whose entering stream the target graphs output (n_layers: the target's depth, None: unknown)."""
    ids = _draft_value(raw, "target_layer_ids", folder)
    if ids is None:
        if not n_target:
            raise fail(folder, "config.json names neither target_layer_ids nor num_target_layers (z-lab's rule)")
        ids = zlab_layer_ids(n_target, n_draft_layers)
    ids = tuple(int(i) for i in ids)
    depth = n_layers or n_target
    if not ids:
        raise fail(folder, "target_layer_ids is empty")
    for i in ids:
        if depth and i == depth - 1:
            raise fail(
                folder,
                f"target layer id {i} is the target's last layer, whose output z-lab reads after the final norm "
                "(hidden_states[L]); edgespec's target graphs output residual streams entering a layer only",
            )
        if i < -1 or (depth and i > depth - 1):
            raise fail(folder, f"target layer id {i} is outside the target's -1..{depth - 2 if depth else 'L-2'}")
    return ids


def parse_config(
    raw: dict, folder: Path, hidden_size: int | None, vocab_size: int | None, n_layers: int | None
) -> tuple[DFlashConfig, tuple[int, ...]]:
    """config.json's drafter, checked against the target's hidden size, vocabulary and depth where
    given: (its config, target_layer_ids as stored: the order of fc's column blocks)."""
    c = _checked_config(raw, folder)
    H = int(c["hidden_size"])
    if hidden_size is not None and H != hidden_size:
        raise fail(
            folder,
            f"drafter width {H} does not fit the target's hidden size {hidden_size}; was it trained for another model?",
        )
    vocab = int(raw.get("vocab_size") or vocab_size or 0)
    if vocab_size is not None and vocab != vocab_size:
        raise fail(folder, f"drafter vocab {vocab} != target vocab {vocab_size}; was it trained for another model?")
    n_target = int(raw.get("num_target_layers") or 0)
    if n_layers is not None and n_target and n_target != n_layers:
        raise fail(folder, f"trained on a target of {n_target} layers; this target has {n_layers}")
    block, mask = _block_and_mask(raw, folder, vocab)
    ids = _layer_ids(raw, folder, int(c["num_hidden_layers"]), n_target, n_layers)
    theta, rope_type, rope_params = _rope(c, folder)
    softcap = _draft_value(raw, "final_logit_softcapping", folder)
    heads = int(c["num_attention_heads"])
    cfg = DFlashConfig(
        hidden_size=H,
        n_layers=int(c["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(c["num_key_value_heads"]),
        head_dim=int(c["head_dim"]),
        intermediate_size=int(c["intermediate_size"]),
        rms_norm_eps=float(c["rms_norm_eps"]),
        rope_theta=theta,
        vocab_size=vocab,
        draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
        block_size=int(block),
        mask_token_id=int(mask),
        target_layer_ids=tuple(sorted(set(ids))),
        n_target_layers=n_target or int(n_layers or 0),
        rope_type=rope_type,
        rope_params=rope_params,
        attention_bias=bool(c["attention_bias"]),
        embed_scale=float(_draft_value(raw, "input_embedding_scale", folder) or 1.0),
        logit_scale=float(_draft_value(raw, "output_multiplier", folder) or 1.0),
        logit_softcap=float(softcap) if softcap is not None and float(softcap) > 0 else 0.0,
    )
    if cfg.n_heads % cfg.n_kv_heads:
        raise fail(folder, f"{cfg.n_heads} query heads are not a multiple of {cfg.n_kv_heads} key/value heads")
    if eps_problem(c["rms_norm_eps"]):
        raise fail(folder, f"config.json: {eps_problem(c['rms_norm_eps'])}")
    return cfg, ids


def zlab_config(c: DFlashConfig, dtype: str) -> dict:
    """config.json of z-lab's layout for `c` with weights in `dtype` ("bfloat16", ...): Qwen3Config's
    fields, the RoPE under transformers 4's names (rope_theta + rope_scaling, as z-lab's published
    drafters have it; transformers 5 reads them too), block_size both at the top level (z-lab's
    releases) and in dflash_config (z-lab's class looks there first), the non-default scalings."""
    scaling = None if c.rope_type == "default" else {"rope_type": c.rope_type} | dict(c.rope_params)
    draft = {"block_size": c.block_size, "mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)}
    for key, value, default in (
        ("input_embedding_scale", c.embed_scale, 1.0),
        ("output_multiplier", c.logit_scale, 1.0),
        ("final_logit_softcapping", c.logit_softcap, 0.0),
    ):
        if value != default:
            draft[key] = value
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "is_causal": False,
        "attention_bias": c.attention_bias,
        "block_size": c.block_size,
        "dflash_config": draft,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "layer_types": ["full_attention"] * c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "num_key_value_heads": c.n_kv_heads,
        **({"num_target_layers": c.n_target_layers} if c.n_target_layers else {}),
        "rms_norm_eps": c.rms_norm_eps,
        "rope_scaling": scaling,
        "rope_theta": c.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "use_sliding_window": False,
        "vocab_size": c.vocab_size,
    }
