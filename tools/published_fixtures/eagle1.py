"""Writes the EAGLE-1/2 published-layout fixtures (tests/fixtures/published/eagle1-official*/) with the
upstream project's own code: SafeAILab/EAGLE's EAGLE-1/2 model class (eagle/model/cnets1.py `Model`,
its `EConfig`), built, loaded and run the way its `EaModel.from_pretrained` does, saved as its
checkpoints are published (torch.save of the model's state_dict as pytorch_model.bin, beside a
one-layer LlamaConfig-like config.json with `bias`, `rope_theta` and, on Qwen2 heads, `qkv_bias`).

Two heads, each in fp32, fp16 and bf16:
  eagle1-official        Llama shape, like EAGLE-LLaMA3-Instruct-8B: no fc bias (`bias: false`),
                         rope_theta 500000 (its tiny Llama target: 10000, so the head's own RoPE shows)
  eagle1-official-qwen2  Qwen2 shape, like EAGLE-Qwen2-7B-Instruct: fc bias, q/k/v biases
                         (`qkv_bias: true`), rope_theta 1e6, rms_norm_eps 1e-6
for the tiny targets of tests/tiny.py (make_tiny("llama") / make_tiny("qwen2"), seed 0, made by the
edgespec venv's python so they are the tests' targets bit for bit). The head's embed_tokens is the
target's, read by the upstream class's own loader (load_emb, through a weights index).

Beside each checkpoint, reference.npz: input_ids [1, T], hidden_states [1, T, H] (the features), the
upstream forward's out_hidden [1, T, H] and logits [1, T, V] (out_hidden times the target's LM
head, as EaModel drafts), computed in fp32 on the stored (rounded) weights. The fp32 Llama
reference also holds out_hidden_linear2: the same weights under `rope_scaling: {type: linear,
factor: 2}` (a variant the reader must honour), and out_hidden_cached: the rows computed in two
calls (6 rows, then the rest on the KV cache), as EAGLE drafts.

Needs a Python with torch and a transformers the upstream code runs on (it reads
config.rope_scaling["type"], which transformers 5 rewrites): transformers 4.53, e.g.

    python3 -m venv /tmp/venv_eagle1 && /tmp/venv_eagle1/bin/pip install torch transformers==4.53.1
    /tmp/venv_eagle1/bin/python tools/published_fixtures/eagle1.py --eagle-src PATH_TO_SafeAILab_EAGLE

--eagle-src: a checkout of github.com/SafeAILab/EAGLE (or its git directory: HEAD is read with git
archive); --edgespec-python: the Python that has edgespec's test helpers' dependencies (default
.venv/bin/python).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "published"
N_ROWS = 12  # rows of the reference forward
SPLIT = 6  # out_hidden_cached: rows 0..SPLIT-1 first, then the rest on the cache
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# config.json of each head, as the upstream repo's configs look (eagle/train/EAGLE-LLaMA3-Instruct-8B;
# Qwen2 heads: Qwen2's config fields plus qkv_bias), at the tiny targets' shapes
CONFIGS = {
    "eagle1-official": (
        "llama",
        {
            "architectures": ["LlamaForCausalLM"],
            "bos_token_id": 2,
            "eos_token_id": 1,
            "hidden_act": "silu",
            "hidden_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "max_position_embeddings": 2048,
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 1,
            "pad_token_id": 0,
            "rms_norm_eps": 1e-05,
            "tie_word_embeddings": False,
            "transformers_version": "4.28.1",
            "use_cache": True,
            "vocab_size": 256,
            "rope_theta": 500000.0,
            "bias": False,
        },
    ),
    "eagle1-official-qwen2": (
        "qwen2",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "hidden_act": "silu",
            "hidden_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "max_position_embeddings": 32768,
            "max_window_layers": 28,
            "model_type": "qwen2",
            "num_attention_heads": 4,
            "num_hidden_layers": 1,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 131072,
            "tie_word_embeddings": False,
            "transformers_version": "4.41.2",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 256,
            "qkv_bias": True,
            "bias": True,
        },
    ),
}


def upstream_modules(src: Path, work: Path) -> tuple[types.ModuleType, types.ModuleType, str]:
    """(cnets1, configs, commit) of the upstream source: its eagle/model folder imported as a package
    of its own (its __init__ and ea_model, which load serving models, are not needed)."""
    commit = "unknown"
    if (src / "eagle" / "model" / "cnets1.py").exists():
        model_dir = src / "eagle" / "model"
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = head.stdout.strip() or commit
    else:  # a git directory: its HEAD's eagle/model
        commit = subprocess.run(
            ["git", "--git-dir", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        tar = subprocess.run(
            ["git", "--git-dir", str(src), "archive", "HEAD", "eagle/model"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=tar, check=True)
        model_dir = work / "eagle" / "model"
    pkg = types.ModuleType("eagle_upstream")
    pkg.__path__ = [str(model_dir)]
    sys.modules["eagle_upstream"] = pkg
    return importlib.import_module("eagle_upstream.cnets1"), importlib.import_module("eagle_upstream.configs"), commit


def tiny_target(python: str, model_type: str, folder: Path) -> Path:
    """tests/tiny.py's target, made by the edgespec venv (the tests' bits), with a weights index so the
    upstream class's load_emb finds its embedding."""
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, 'tests'); from tiny import make_tiny; "
        f"make_tiny({model_type!r}, Path({str(folder)!r}))"
    )
    subprocess.run([python, "-c", code], cwd=ROOT, check=True)
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def load_like_eamodel(cnets1, configs, head_dir: Path, target: Path):
    """The head as EaModel.from_pretrained builds it (use_eagle3=False): EConfig from config.json,
    `bias` from the raw json, Model1 with the target's embedding, the state dict loaded non-strictly
    (what it skipped is refused, so nothing relies on a dropped tensor; an embed_tokens left out is
    the target's, which load_emb read)."""
    config = configs.EConfig.from_pretrained(str(head_dir / "config.json"))
    bias = json.loads((head_dir / "config.json").read_text()).get("bias", True)
    model = cnets1.Model(config, bias=bias, path=str(target), load_emb=True)
    state = torch.load(head_dir / "pytorch_model.bin", map_location="cpu")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "embed_tokens.weight"]
    if missing or unexpected:
        raise SystemExit(f"{head_dir}: the upstream loader skipped {missing} / {unexpected}")
    return model.float().eval()


def target_lm_head(target: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    w = load_file(str(target / "model.safetensors"))
    return w.get("lm_head.weight", w["model.embed_tokens.weight"]).float()


def forward(model, hidden: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(hidden, input_ids=ids).numpy()


def forward_cached(model, hidden: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    """Rows 0..SPLIT-1 in one call, the rest in a second on its KV cache (EAGLE's stable_kv path)."""
    with torch.no_grad():
        a, kv = model(hidden[:, :SPLIT], input_ids=ids[:, :SPLIT], use_cache=True)
        b, _ = model(hidden[:, SPLIT:], input_ids=ids[:, SPLIT:], past_key_values=kv, use_cache=True)
    return torch.cat([a, b], dim=1).numpy()


def randomize(model, seed: int) -> None:
    """Random weights on the scale of a trained head (norms near 1, small biases): a missing op or a
    wrong table shows in the parity checks. The embedding stays the target's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "embed_tokens.weight":
                continue
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


def write_layout(layout: str, cnets1, configs, target: Path, lm_head: torch.Tensor, work: Path, seed: int) -> None:
    _, config = CONFIGS[layout]
    cfg_dir = work / layout
    cfg_dir.mkdir()
    (cfg_dir / "config.json").write_text(json.dumps(config, indent=2))
    base = cnets1.Model(
        configs.EConfig.from_pretrained(str(cfg_dir / "config.json")),
        bias=config["bias"],
        path=str(target),
        load_emb=True,
    )
    randomize(base, seed)
    g = torch.Generator().manual_seed(seed + 1)
    H = config["hidden_size"]
    hidden = torch.randn(1, N_ROWS, H, generator=g)
    ids = torch.randint(0, config["vocab_size"], (1, N_ROWS), generator=g)
    for tag, dtype in DTYPES.items():
        folder = OUT / layout / tag
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(
            json.dumps(
                config | {"torch_dtype": {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[tag]}, indent=2
            )
        )
        torch.save({k: v.to(dtype) for k, v in base.state_dict().items()}, folder / "pytorch_model.bin")
        model = load_like_eamodel(cnets1, configs, folder, target)
        out = forward(model, hidden, ids)
        ref = {
            "input_ids": ids.numpy(),
            "hidden_states": hidden.numpy(),
            "out_hidden": out,
            "logits": (torch.from_numpy(out) @ lm_head.T).numpy(),
            "out_hidden_cached": forward_cached(model, hidden, ids),
        }
        if layout == "eagle1-official" and tag == "fp32":  # the same weights under linear RoPE scaling
            variant = work / "linear2"
            variant.mkdir()
            linear = {k: v for k, v in config.items() if k != "rope_theta"}
            (variant / "config.json").write_text(
                json.dumps(linear | {"rope_scaling": {"type": "linear", "factor": 2.0}})
            )
            (variant / "pytorch_model.bin").symlink_to(folder / "pytorch_model.bin")
            ref["out_hidden_linear2"] = forward(load_like_eamodel(cnets1, configs, variant, target), hidden, ids)
        np.savez(folder / "reference.npz", **ref)
        print(f"wrote {folder.relative_to(ROOT)}", file=sys.stderr)


def check(cnets1, configs, head_dir: Path, target: Path, ref: Path) -> float:
    """`check`: a folder written by `edgespec export-drafter --format eagle1-official`, loaded as
    EaModel does, run on ref's inputs; returns max |its logits - ref's logits| (ref: an .npz with
    input_ids, hidden_states, logits, e.g. edgespec's own head's)."""
    r = np.load(ref)
    model = load_like_eamodel(cnets1, configs, head_dir, target)
    out = forward(model, torch.from_numpy(r["hidden_states"]), torch.from_numpy(r["input_ids"]))
    logits = (torch.from_numpy(out) @ target_lm_head(target).T).numpy()
    return float(np.abs(logits - r["logits"]).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eagle-src", required=True, help="SafeAILab/EAGLE checkout or git directory")
    p.add_argument("--edgespec-python", default=str(ROOT / ".venv" / "bin" / "python"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check",
        nargs=3,
        metavar=("HEAD_DIR", "TARGET_TYPE", "REF_NPZ"),
        help="instead: load HEAD_DIR (an export-drafter output) with the upstream class for the tiny "
        "target TARGET_TYPE (llama / qwen2) and print max |logits - REF_NPZ's logits|",
    )
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cnets1, configs, commit = upstream_modules(Path(a.eagle_src), work)
        if a.check:
            head_dir, model_type, ref = a.check
            target = tiny_target(a.edgespec_python, model_type, work / model_type)
            print(
                f"max |upstream logits - reference| = {check(cnets1, configs, Path(head_dir), target, Path(ref)):.3g}"
            )
            return
        import transformers

        for i, (layout, (model_type, _)) in enumerate(CONFIGS.items()):
            target = tiny_target(a.edgespec_python, model_type, work / f"target-{model_type}")
            write_layout(layout, cnets1, configs, target, target_lm_head(target), work, a.seed + 10 * i)
            (OUT / layout / "upstream.json").write_text(
                json.dumps(
                    {
                        "repository": "https://github.com/SafeAILab/EAGLE",
                        "commit": commit,
                        "model_class": "eagle/model/cnets1.py Model (EConfig from eagle/model/configs.py)",
                        "saved_with": "torch.save(model.to(dtype).state_dict(), 'pytorch_model.bin')",
                        "loaded_as": "EaModel.from_pretrained(use_eagle3=False): load_state_dict(strict=False)",
                        "target": f"tests/tiny.py make_tiny({model_type!r}) (seed 0)",
                        "torch": torch.__version__,
                        "transformers": transformers.__version__,
                        "script": "tools/published_fixtures/eagle1.py",
                    },
                    indent=2,
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
