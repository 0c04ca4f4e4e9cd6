"""An EAGLE-3 head (any layout layouts.py reads) written in another project's layout: vLLM speculators
or the official EAGLE code (`edgespec export-drafter --format`), every float in the dtype it is stored in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.export.drafters._files import TensorInfo, WeightsFileError, read_json
from edgespec.export.drafters.eagle3.config import Eagle3Config, Eagle3FormatError
from edgespec.export.drafters.eagle3.layouts import CORE, Eagle3Checkpoint, inspect, stored_name

FORMATS = ("speculators", "eagle3-official")  # what `publish` writes (`edgespec export-drafter --format`)


def _torch_dtype(info: TensorInfo):
    import torch

    return {
        "F32": torch.float32,
        "float32": torch.float32,
        "F16": torch.float16,
        "float16": torch.float16,
        "BF16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
    }[info.dtype]


def _tensors(ck: Eagle3Checkpoint, arrays: dict[str, np.ndarray], rename) -> dict:
    """Torch tensors under the written layout's names (`rename`), each float in the dtype it was stored
    in (nothing rounded), d2t relative and t2d when the draft vocabulary is a subset."""
    import torch

    ec, out = ck.ec, {}
    for ours in (*CORE, "embed_tokens.weight"):
        if ours in arrays:
            out[rename(ours)] = torch.from_numpy(arrays[ours]).to(_torch_dtype(ck.infos[ck.names[ours]]))
    if ec.draft_vocab_size < ec.vocab_size:
        d2t = arrays["d2t"]
        t2d = np.zeros(ec.vocab_size, bool)
        t2d[d2t] = True
        out["d2t"] = torch.from_numpy(d2t - np.arange(len(d2t)))
        out["t2d"] = torch.from_numpy(t2d)
    return out


def _refuse_publish(ck: Eagle3Checkpoint, fmt: str, what: str):
    from edgespec.export.target.spec import ExportError

    return ExportError(f"{ck.folder} ({ck.layout}) cannot be written as {fmt}: {what}")


def publish(folder: Path, fmt: str, out: Path, verifier: str | None = None) -> Path:
    """The head in `folder` (any layout `inspect` reads) written into the new folder `out` in layout
    `fmt` (FORMATS), every float in the dtype it is stored in; what the layout cannot carry is refused
    (ExportError) before anything is written. verifier (speculators): the target model speculators'
    from_pretrained reads (`_verifier`)."""
    from edgespec.export.target.spec import ExportError

    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: the EAGLE-3 layouts written are {', '.join(FORMATS)}")
    try:
        ck = inspect(Path(folder))
    except Eagle3FormatError as e:
        raise ExportError(str(e)) from e
    ec = ck.ec
    if fmt == "speculators":
        config, rename = _speculators_config(ck, verifier), lambda n: stored_name("eagle3-speculators", n)
    else:
        config, rename = _official_config(ck), lambda n: n
    try:
        arrays = ck.load()
    except (Eagle3FormatError, WeightsFileError) as e:
        raise ExportError(str(e)) from e
    tensors = _tensors(ck, arrays, rename)
    if "fc_norm.weight" in arrays:  # speculators only (the official layout refused it)
        import torch

        w = torch.from_numpy(arrays["fc_norm.weight"]).to(_torch_dtype(ck.infos[ck.fc_norm_names[0]]))
        if ec.fc_norm == "whole":
            tensors["input_norm.weight"] = w
        else:
            tensors |= {f"fc_norm.{i}.weight": b for i, b in enumerate(w.chunk(ec.n_blocks))}
    out = Path(out)
    out.mkdir(parents=True)
    if fmt == "speculators":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    else:
        import torch

        torch.save(tensors, out / "pytorch_model.bin")  # the official loader's first choice
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if fmt == "speculators" and config["speculators_config"]["verifier"]["name_or_path"] is None:
        import sys

        print(
            f"edgespec: {folder} names no target model, so the speculators config's verifier is null: vLLM does not "
            "read it, speculators' from_pretrained does. Hint: pass --verifier NAME_OR_PATH (hub id or folder)",
            file=sys.stderr,
        )
    return out


def _llama_layer(ec: Eagle3Config) -> dict:
    """The head's decoder layer as a LlamaConfig dict (rope_parameters: transformers 5's form)."""
    return {
        "model_type": "llama",
        "hidden_size": ec.hidden_size,
        "intermediate_size": ec.intermediate_size,
        "num_attention_heads": ec.num_attention_heads,
        "num_key_value_heads": ec.num_key_value_heads,
        "head_dim": ec.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": ec.rms_norm_eps,
        "vocab_size": ec.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": ec.rope_type, "rope_theta": ec.rope_theta, **dict(ec.rope_params)},
    } | ({"layer_types": ["sliding_attention"], "sliding_window": ec.sliding_window} if ec.sliding_window else {})


def _verifier(ck: Eagle3Checkpoint, given: str | None) -> dict:
    """speculators' VerifierConfig of the head: `given` (--verifier), else the one the folder records (a
    speculators config's verifier; edgespec's training record's target, a packaged model by its hub id).
    speculators' from_pretrained reads the verifier's config.json (hidden size, depth) and fills the
    weights the head lacks (its embedding) from the verifier's weights, so a local folder is checked
    against the head here and written as an absolute path; a hub id is written as given."""
    from edgespec.export.drafters.medusa.publish import HF_IDS

    recorded = (ck.config.get("speculators_config") or {}).get("verifier") or {}
    target = (ck.config.get("eagle3") or {}).get("target") if ck.layout == "eagle3-edgespec" else None
    name = given or recorded.get("name_or_path") or (HF_IDS.get(target, target) if target else None)
    archs = list(recorded.get("architectures") or [])
    path = Path(name).expanduser() if name else None
    if path is None or not path.exists():
        if given and (given.startswith((".", "/", "~")) or given.count("/") != 1):
            raise _refuse_publish(ck, "speculators", f"--verifier {given}: no such folder, nor a hub id (org/name)")
        return {"name_or_path": name, "architectures": archs}
    try:
        cfg = read_json(path / "config.json")
    except (OSError, ValueError) as e:
        raise _refuse_publish(
            ck,
            "speculators",
            f"verifier {name}: no readable config.json ({type(e).__name__}); speculators' from_pretrained reads "
            "the target's config and weights from it. Hint: pass --verifier with the target's Hugging Face folder",
        ) from e
    cfg = cfg.get("text_config") or cfg  # multimodal wrappers: speculators reads the text model's
    wrong = [
        f"{k} {cfg.get(k)} (the head's {v})"
        for k, v in (("hidden_size", ck.ec.feature_width), ("vocab_size", ck.ec.vocab_size))
        if cfg.get(k) != v
    ]
    if wrong:
        raise _refuse_publish(ck, "speculators", f"verifier {name} has {', '.join(wrong)}: another model's")
    return {"name_or_path": str(path.resolve()), "architectures": list(cfg.get("architectures") or archs)}


def _speculators_config(ck: Eagle3Checkpoint, verifier: str | None = None) -> dict:
    """An Eagle3SpeculatorConfig (speculators 0.9) of the head; aux ids stay entering ids (vLLM's)."""
    ec = ck.ec
    if not ec.logits_norm:
        raise _refuse_publish(
            ck,
            "speculators",
            "its logits skip the final norm (SpecForge norm_output false); speculators' head always norms them",
        )
    if ec.feature_width != ec.hidden_size:
        raise _refuse_publish(
            ck,
            "speculators",
            f"its fc reads target features of width {ec.feature_width} into a head of width {ec.hidden_size}; "
            "speculators' Eagle3DraftModel builds fc over n*hidden_size features only",
        )
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": ec.draft_vocab_size,
        "norm_before_residual": ec.norm_before_residual,
        "norm_before_fc": ec.fc_norm == "whole",
        "fc_norm": ec.fc_norm == "per_layer",
        "norm_output": ec.feed_normed,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(ec.aux_layers) or None,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "transformer_layer_config": _llama_layer(ec),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": _verifier(ck, verifier),
        },
    }


def _official_config(ck: Eagle3Checkpoint) -> dict:
    """The official EAGLE-3 code's config.json (EConfig) of the head, or what it cannot carry refused."""
    ec = ck.ec
    why = []
    if ec.fc_norm != "none":
        why.append(f"an fc norm ({ec.fc_norm})")
    if ec.norm_before_residual:
        why.append("norm_before_residual")
    if not ec.logits_norm:
        why.append("logits without the final norm")
    if ec.feed_normed:
        why.append("the normed output fed back (speculators norm_output)")
    if ec.rope_type not in ("default", "linear"):
        why.append(f"RoPE scaling {ec.rope_type!r} (it computes linear only)")
    if ec.head_dim * ec.num_attention_heads != ec.hidden_size:
        why.append(f"head_dim {ec.head_dim} x {ec.num_attention_heads} heads != hidden_size {ec.hidden_size}")
    if ec.n_blocks != 3:
        why.append(f"{ec.n_blocks} feature blocks (it feeds 3)")
    if ec.sliding_window:
        why.append(f"a sliding-window layer (sliding_window={ec.sliding_window}; it attends to every position)")
    ids = ec.aux_layers
    if ids and (len(ids) != 3 or ids[0] != 2 or ids[1] != (ids[2] + 3) // 2):
        why.append(f"aux layers {list(ids)} (its target code feeds the streams entering 2, L//2, L-3)")
    if why:
        raise _refuse_publish(ck, "eagle3-official", "the official EAGLE-3 code computes none of: " + "; ".join(why))
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": ec.hidden_size,
        "intermediate_size": ec.intermediate_size,
        "num_attention_heads": ec.num_attention_heads,
        "num_key_value_heads": ec.num_key_value_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": ec.rms_norm_eps,
        "vocab_size": ec.vocab_size,
        "draft_vocab_size": ec.draft_vocab_size,
        "rope_theta": ec.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "pretraining_tp": 1,
        "torch_dtype": "float16",
    }
    if ec.rope_type == "linear":
        out["rope_scaling"] = {"type": "linear", "factor": dict(ec.rope_params)["factor"]}
    if ec.feature_width != ec.hidden_size:
        out["target_hidden_size"] = ec.feature_width
    return out
