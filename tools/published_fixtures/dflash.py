"""Tiny DFlash drafters written by z-lab's own code, with their own forward's outputs, for
tests/test_published_dflash.py (layout id `dflash-zlab`).

z-lab's package `dflash` 0.1.0 (PyPI; installed --no-deps beside torch and transformers 5.x) builds
each drafter (`DFlashDraftModel` on a Qwen3Config shaped as their releases are: top-level
block_size, dflash_config {mask_token_id, target_layer_ids}, num_target_layers, layer_types), saves
it with its own `save_pretrained` in the dtype asked, loads it back with `from_pretrained` in fp32
and records two drafting calls exactly as its `dflash_generate` makes them (their
`_raw_input_embeddings`, `extract_context_feature`, `_make_cache` / `_crop_to` and
`compute_logits`): the second call reads the context K/V the first cached. Nothing here is
edgespec's except the publish fixture's source, which edgespec writes (`--edgespec-side`, run by
this script with edgespec's venv) and z-lab's class then loads.

    /work/scratch/venv/bin/python tools/published_fixtures/dflash.py   # rewrites tests/fixtures/published/dflash-*

Each folder: config.json + model.safetensors (z-lab's save) and reference.npz:
  embed, lm_head [V, H]     the target's tables the calls read (tests give a make_tiny target these);
                            fp16 values, stored as fp16 (so exactly), like hidden_states
  hidden_states [L+1, N, H] the target's hidden_states (random) whose rows z-lab's
                            extract_context_feature picks; zlab_reads: the index it picks for
                            ids 0..L-2; zlab_target_layer_ids, block_size: as its class took them
  tokens [N+1]              the token at each position (anchors: tokens[C1], tokens[C2])
  calls [2] = (C1, C2)      context rows before call 1 / call 2
  logits1, logits2 [b-1, V] z-lab's draft logits of block rows 1.. (fp32 forward of the stored weights)
  sensitivity_<what>        max |logits1 change| when <what> is left out (rope: the target's RoPE in
                            place of the drafter's; ids: features in ascending order; bias, scales):
                            large, so a match within 1e-4 shows the field is honoured
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# this file's folder leaves the import path: its name would shadow z-lab's package `dflash`
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "published"
EDGESPEC_PYTHON = ROOT / ".venv" / "bin" / "python"
V, H, L = 256, 64, 6  # the tiny targets' vocabulary, width and depth (tests/tiny.py make_tiny, 6 layers)
C1, C2 = 7, 12  # context rows before the first / second call
MASK = 255


def target_tables(family: str) -> tuple[np.ndarray, np.ndarray]:
    """The embedding and LM head the calls read; the tiny llama ties them (as make_tiny's does)."""
    rng = np.random.default_rng({"qwen3": 1, "llama": 2}[family])
    embed = rng.normal(0, 1.0, (V, H)).astype(np.float16).astype(np.float32)  # fp16 values: stored as such
    return embed, embed.copy() if family == "llama" else rng.normal(0, 0.5, (V, H)).astype(np.float16).astype(
        np.float32
    )


# family, dtype, draft layers, own head_dim / MLP width, config fields: each a release's shape, scaled down
QWEN3 = dict(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})  # Qwen3-*-DFlash-b16
LLAMA = dict(  # LLaMA3.1-8B-Instruct-DFlash: Llama 3.1's RoPE (theta 500000, llama3 scaling)
    head_dim=16,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
)
FIXTURES = {
    "dflash-zlab-qwen3-bf16": ("qwen3", "bfloat16", 2, 128, QWEN3, {"target_layer_ids": [1, 3]}, {"block_size": 4}),
    # target_layer_ids left out: z-lab's rule from num_target_layers (6 layers, 1 draft layer: [3])
    "dflash-zlab-qwen3-fp16": ("qwen3", "float16", 1, 96, QWEN3, {}, {"block_size": 5}),
    "dflash-zlab-qwen3-fp32": ("qwen3", "float32", 1, 96, QWEN3, {"target_layer_ids": [0, 2, 4]}, {"block_size": 4}),
    "dflash-zlab-llama-bf16": ("llama", "bfloat16", 2, 128, LLAMA, {"target_layer_ids": [1, 3]}, {"block_size": 4}),
    # every variant flag z-lab's class reads: biases, unsorted and repeated ids, block_size in
    # dflash_config, the embedding / logit scalings and soft-capping
    "dflash-zlab-variants-fp32": (
        "qwen3",
        "float32",
        1,
        96,
        QWEN3 | {"attention_bias": True},
        {
            "target_layer_ids": [3, 1, 3],
            "block_size": 4,
            "input_embedding_scale": 8.0,
            "output_multiplier": 0.5,
            "final_logit_softcapping": 3.0,
        },
        {},
    ),
}


def build(dtype: str, n_layers: int, inner: int, fields: dict, draft: dict, top: dict, seed: int):
    """A DFlashDraftModel of z-lab's class, random weights (their init, a wider std so attention is
    far from uniform; norms and biases perturbed so each op shows), cast to `dtype`."""
    import torch
    from dflash import DFlashDraftModel
    from transformers import Qwen3Config

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=inner,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_target_layers=L,
        initializer_range=0.15,
        dflash_config={"mask_token_id": MASK} | draft,
        **fields,
        **top,
    )
    model = DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    return model.to(getattr(torch, dtype))


def zlab_calls(model, embed: np.ndarray, lm_head: np.ndarray, hidden: np.ndarray, tokens: np.ndarray) -> list:
    """Two drafting calls as z-lab's dflash_generate makes them: [logits of block rows 1..]."""
    import torch
    from dflash.model import _crop_to, _draft_value, _make_cache, _output_head, _raw_input_embeddings
    from dflash.model import extract_context_feature as features
    from torch import nn

    class Target(nn.Module):  # what dflash_generate reads of the target: its embedding and LM head
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding.from_pretrained(torch.from_numpy(embed))
            self.lm_head = nn.Linear(H, V, bias=False)
            self.lm_head.weight.data = torch.from_numpy(lm_head)

        def get_input_embeddings(self):
            return self.embed

    target, b = Target(), model.block_size
    hs = [torch.from_numpy(h[None]) for h in hidden]  # hidden_states[j] [1, N, H]
    cache = _make_cache(model.config)
    pos = torch.arange(len(tokens) + b)[None]
    out, done = [], 0
    with torch.no_grad():
        for start in (C1, C2):
            ctx = features([h[:, done:start] for h in hs], model.target_layer_ids)  # the rows not yet cached
            ids = torch.full((1, b), MASK, dtype=torch.long)
            ids[0, 0] = int(tokens[start])
            noise = _raw_input_embeddings(target, ids, float(_draft_value(model.config, "input_embedding_scale", 1.0)))
            hid = model(
                target_hidden=ctx,
                noise_embedding=noise,
                position_ids=pos[:, done : start + b],
                past_key_values=cache,
                use_cache=True,
            )[:, 1 - b :, :]
            _crop_to(cache, start)
            out.append(model.compute_logits(hid, _output_head(target))[0].float().numpy())
            done = start
    return out


def zlab_reads() -> list[int]:
    """Which hidden_states z-lab's extract_context_feature picks for ids 0..L-2 (marker tensors)."""
    import torch
    from dflash.model import extract_context_feature

    marks = [torch.full((1, 1, 1), float(j)) for j in range(L + 1)]
    return [int(x) for x in extract_context_feature(marks, list(range(L - 1)))[0, 0]]


def record(folder: Path, family: str, model_fp32, sensitivities: dict) -> None:
    """reference.npz for the fp32 reload `model_fp32` of the saved folder."""
    rng = np.random.default_rng(7)
    embed, lm_head = target_tables(family)
    hidden = rng.normal(0, 1.0, (L + 1, C2, H)).astype(np.float16).astype(np.float32)
    tokens = rng.integers(2, 200, C2 + 1)
    logits = zlab_calls(model_fp32, embed, lm_head, hidden, tokens)
    sens = {
        f"sensitivity_{k}": float(np.abs(fn(embed, lm_head, hidden, tokens) - logits[0]).max())
        for k, fn in sensitivities.items()
    }
    np.savez_compressed(
        folder / "reference.npz",
        embed=embed.astype(np.float16),  # exact: the values are fp16's
        lm_head=lm_head.astype(np.float16),
        hidden_states=hidden.astype(np.float16),
        zlab_reads=np.array(zlab_reads()),
        zlab_target_layer_ids=np.array(model_fp32.target_layer_ids),  # as z-lab's class took them
        block_size=np.array(model_fp32.block_size),
        tokens=tokens,
        calls=np.array([C1, C2]),
        logits1=logits[0],
        logits2=logits[1],
        **{k: np.array(v) for k, v in sens.items()},
    )
    print(f"{folder.name}: logits {logits[0].shape}, " + ", ".join(f"{k} {v:.3g}" for k, v in sens.items()))


def variant(folder: Path, change) -> object:
    """The saved drafter reloaded in fp32 with its config.json changed by `change` (a dict -> dict)."""
    import torch
    from dflash import DFlashDraftModel

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(folder / "model.safetensors", tmp)
        cfg = json.loads((folder / "config.json").read_text())
        (Path(tmp) / "config.json").write_text(json.dumps(change(cfg)))
        return DFlashDraftModel.from_pretrained(tmp, dtype=torch.float32).eval()


def sensitivities(folder: Path, family: str, fields: dict, draft: dict) -> dict:
    """What leaving each honoured field out would change (see the module docstring)."""
    import torch
    from dflash import DFlashDraftModel

    def calls_of(model):
        return lambda e, w, h, t: zlab_calls(model, e, w, h, t)[0]

    def without(*keys):
        return lambda c: c | {"dflash_config": {k: v for k, v in c["dflash_config"].items() if k not in keys}}

    out = {
        "rope": calls_of(
            variant(folder, lambda c: c | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
        )
    }
    if fields.get("attention_bias"):
        model = DFlashDraftModel.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("bias"):
                    p.zero_()
        out["bias"] = calls_of(model)
    for key in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
        if key in draft:
            out[key] = calls_of(variant(folder, without(key)))
    ids = draft.get("target_layer_ids")
    if ids and list(ids) != sorted(ids):
        asc = sorted(ids)
        out["ids"] = calls_of(
            variant(folder, lambda c: c | {"dflash_config": c["dflash_config"] | {"target_layer_ids": asc}})
        )
    return out


def write_zlab(name: str, spec: tuple, seed: int) -> None:
    import torch
    from dflash import DFlashDraftModel

    family, dtype, n_layers, inner, fields, draft, top = spec
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    build(dtype, n_layers, inner, fields, draft, top, seed).save_pretrained(folder)
    model = DFlashDraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    record(folder, family, model, sensitivities(folder, family, fields, draft))


def write_publish() -> None:
    """edgespec's drafter (edgespec's venv writes it) -> `edgespec export-drafter --format dflash-zlab` ->
    z-lab's class loads the result: its outputs recorded. The test publishes the same source again."""
    import torch
    from dflash import DFlashDraftModel

    folder = OUT / "dflash-zlab-publish"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    subprocess.run([str(EDGESPEC_PYTHON), __file__, "--edgespec-side", str(folder / "edgespec")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        published = Path(tmp) / "zlab"
        cli = [str(EDGESPEC_PYTHON), "-m", "edgespec.cli", "export-drafter", str(folder / "edgespec")]
        subprocess.run([*cli, "--format", "dflash-zlab", "--out", str(published)], check=True)
        shutil.copy(published / "config.json", folder / "published_config.json")
        model = DFlashDraftModel.from_pretrained(published, dtype=torch.float32).eval()
        record(folder, "qwen3", model, {})


def edgespec_side(out: Path) -> None:
    """(edgespec's venv) An edgespec DFlash drafter for a 6-layer qwen3 tiny target: random weights,
    a 48-token draft vocabulary, saved by save_dflash (edgespec's layout, fp16)."""
    import torch

    from edgespec.export.drafters._torch import Frozen
    from edgespec.export.drafters.dflash.model import DFlashConfig, DFlashDrafter, save_dflash

    rng = np.random.default_rng(5)
    cfg = DFlashConfig(
        hidden_size=H,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        vocab_size=V,
        draft_vocab_size=48,
        block_size=4,
        mask_token_id=MASK,
        target_layer_ids=(1, 2),  # edgespec's aux layers of a 6-layer target (2, 3), in z-lab's terms
        n_target_layers=L,
    )
    d2t = np.sort(rng.permutation(V)[:48]).astype(np.int64)
    embed = torch.zeros(V, H)
    frozen = Frozen(embed, torch.from_numpy(d2t), torch.zeros(8, 32), torch.zeros(8, 32))
    model = DFlashDrafter(cfg, frozen)
    with torch.no_grad():
        for name, p in model.params().items():
            p.copy_(torch.from_numpy(rng.normal(1.0 if "norm" in name else 0.0, 0.15, tuple(p.shape))))
    save_dflash(model, out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edgespec-side", metavar="DIR", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.edgespec_side:
        edgespec_side(Path(a.edgespec_side))
        return 0
    for seed, (name, spec) in enumerate(FIXTURES.items()):
        write_zlab(name, spec, seed)
    write_publish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
