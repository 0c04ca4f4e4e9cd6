"""Tiny Medusa checkpoints written by the Medusa projects' own code, with their own forward outputs,
for tests/test_published_medusa.py (committed, so CI needs none of these packages).

Runs with the scratch venv that has the upstream packages (medusa-llm 0.1 installed --no-deps):

    /work/scratch/venv/bin/python tools/published_fixtures/medusa.py \
        [--medusa-src DIR] [--axolotl-src DIR] [--out tests/fixtures/published]

Each fixture is a folder tests/fixtures/published/medusa-official-<variant>/ written as the project writes
it, plus reference.npz: input_ids [T], the base model's post-norm hidden states `features` [T, H]
(what the heads read) and the upstream forward's `logits` [K, T, V] in fp32, from the saved files
loaded back by the project's own loading code (torch.load / safetensors + load_state_dict(strict=False),
as MedusaModel.from_pretrained does). The base is tests/tiny.py's make_tiny("llama", seed=0), the
tests' tiny llama target; `lm_head_sha256` records its LM head (heads without their own LM heads
use it: `lm_head` holds the table then); `sensitivity_<field>`: how far the upstream logits move
when that field of the heads is left out (own_lm_heads, bias, blocks).

Variants (layout id medusa-official; the writers are in the Medusa repo and its axolotl fork):
  pt-fp16       medusa-llm 0.1 MedusaModel, 3 heads x 1 ResBlock + own LM head each, fp16; train.py's
                torch.save(medusa_head.state_dict(), "medusa_lm_head.pt") + MedusaConfig.save_pretrained
                (the released Medusa-1 heads: vicuna-7b/13b/33b)
  pt-fp32-l2    the same, 2 heads x 2 ResBlocks (the class repeats one ResBlock: tied), fp32
  pt-fp32-l0    the same, 2 heads x 0 ResBlocks (an LM head on the feature), fp32
  st-bf16       train_legacy.py before Medusa "version 2": safetensors save_file of the same
                state dict, "medusa_lm_head.safetensors", bf16
  v2-st-bf16    train_legacy.py at the repo's HEAD (medusa_model_legacy.MedusaModel, config
                version "2"): ResBlocks only, the base model's LM head shared, safetensors, bf16
  medusa2-bf16  Medusa-2 (the axolotl fork's add_medusa_heads + the Trainer's save_pretrained): the
                whole model with medusa_head.* inside model.safetensors and medusa_num_heads /
                medusa_num_layers in the base model's config.json, bf16 (the target is the folder)
  publish       the way out: edgespec heads -> `edgespec export-drafter --format medusa-official`
                -> medusa-llm's MedusaModel (its logits recorded; see `published`)
--medusa-src / --axolotl-src: checkouts of FasterDecoding/Medusa and ctlllll/axolotl (their HEAD),
for the two variants the PyPI package predates.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

# this file is medusa.py: its folder first on sys.path would shadow the upstream `medusa` package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parents[2]
SEED = 0  # make_tiny's seed: the tests' tiny llama target
T = 12  # tokens of the recorded input
BASE_NAME = "edgespec-tests/tiny-llama"  # base_model_name_or_path written into the configs


def _base(folder: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import make_tiny
    from transformers import AutoModelForCausalLM

    make_tiny("llama", folder, seed=SEED)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _train(heads: torch.nn.Module, lm_head: torch.Tensor, seed: int) -> None:
    """Stand-in for training: every ResBlock and per-head LM head moved off its init (zero blocks,
    copies of the base LM head), deterministically."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in heads.named_parameters():  # tied ResBlocks appear once
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("linear.weight"):
                p.copy_(noise * (0.8 / p.shape[1] ** 0.5))
            elif name.endswith("linear.bias"):
                p.copy_(noise * 0.1)
            else:  # a head's own LM head [V, H]
                p.copy_(lm_head.float() + noise * 0.05)


def _record(out: Path, ids, features, logits, lm, shared: bool = False, **sensitivity) -> None:
    """reference.npz: the inputs, the upstream logits, the base's LM head (its sha256; the table itself
    when the heads use it) and, per honoured field, how far the upstream logits move without it."""
    lm = lm.detach().float().numpy()
    np.savez(
        out / "reference.npz",
        input_ids=ids[0].numpy().astype(np.int64),
        features=features[0].float().numpy(),
        logits=logits[:, 0].float().numpy(),
        lm_head_sha256=np.array(hashlib.sha256(lm.tobytes()).hexdigest()),
        **({"lm_head": lm} if shared else {}),
        **{f"sensitivity_{k}": np.array(float((v - logits).abs().max())) for k, v in sensitivity.items()},
    )


def _without(model, ids, what: str):
    """The upstream forward with one field of the loaded heads left out (what edgespec would compute
    if it ignored it): 'own_lm_heads' (the base's LM head instead), 'bias' (the ResBlocks' biases),
    'blocks' (one ResBlock where the config says more)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for head in m.medusa_head:
            if what == "own_lm_heads":
                head[-1].weight.copy_(m.base_model.lm_head.weight)
            elif what == "bias":
                head[0].linear.bias.zero_()
        if what == "blocks":
            m.medusa_head = torch.nn.ModuleList(torch.nn.Sequential(h[0], h[-1]) for h in m.medusa_head)
        return m(input_ids=ids)


def _features(base, ids):
    with torch.no_grad():
        return base.model(input_ids=ids)[0]


def medusa1(base, base_dir: Path, out: Path, n_heads: int, n_layers: int, dtype, fmt: str, seed: int) -> None:
    """medusa-llm 0.1: heads built on the base in `dtype`, saved as train.py (fmt "pt") or
    train_legacy.py before version 2 (fmt "safetensors") saves them; the reference from an fp32
    MedusaModel loading the file as MedusaModel.from_pretrained does."""
    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    work = copy.deepcopy(base).to(dtype)
    model = MedusaModel(work, n_heads, n_layers, str(base_dir))  # tokenizer read from the base folder
    _train(model.medusa_head, work.lm_head.weight, seed)
    out.mkdir(parents=True)
    MedusaConfig(
        medusa_num_heads=n_heads, medusa_num_layers=n_layers, base_model_name_or_path=BASE_NAME
    ).save_pretrained(out)
    state = model.medusa_head.state_dict()
    if fmt == "pt":
        torch.save(state, out / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file

        save_file(state, str(out / "medusa_lm_head.safetensors"))
    ref = MedusaModel(copy.deepcopy(base), n_heads, n_layers, str(base_dir))
    if fmt == "pt":
        loaded = torch.load(out / "medusa_lm_head.pt", map_location="cpu")
    else:
        from safetensors.torch import load_file

        loaded = load_file(str(out / "medusa_lm_head.safetensors"))
    ref.medusa_head.load_state_dict(loaded, strict=False)
    ids = torch.from_numpy(np.random.default_rng(seed).integers(3, 256, (1, T)))
    with torch.no_grad():
        logits = ref(input_ids=ids)  # [K, 1, T, V]
    fields = ["own_lm_heads"] + (["bias"] if n_layers else []) + (["blocks"] if n_layers > 1 else [])
    sens = {f: _without(ref, ids, f) for f in fields}
    _record(out, ids, _features(base, ids), logits, base.lm_head.weight, **sens)


def _legacy_head_class(medusa_src: Path):
    """medusa_model_legacy.MedusaModel from the repo's HEAD (version "2": no per-head LM head). Its
    KV-cache Llama (used by from_pretrained only) predates transformers 5, so that one import is
    stubbed with transformers' own LlamaForCausalLM."""
    import transformers

    for name in [n for n in sys.modules if n == "medusa" or n.startswith("medusa.")]:
        del sys.modules[name]
    sys.path.insert(0, str(medusa_src))
    stub = types.ModuleType("medusa.model.modeling_llama_kv")
    stub.LlamaForCausalLM = transformers.LlamaForCausalLM
    sys.modules["medusa.model.modeling_llama_kv"] = stub
    from medusa.model import medusa_model_legacy

    sys.path.remove(str(medusa_src))
    return medusa_model_legacy


def medusa_v2(base, base_dir: Path, out: Path, medusa_src: Path, n_heads: int, seed: int) -> None:
    """train_legacy.py at HEAD: MedusaConfig(version="2") + save_file(medusa_head.state_dict(),
    "medusa_lm_head.safetensors"); ResBlocks only, logits through the base's LM head."""
    from safetensors.torch import load_file, save_file

    legacy = _legacy_head_class(medusa_src)
    work = copy.deepcopy(base).to(torch.bfloat16)
    model = legacy.MedusaModel(work, n_heads, 1, str(base_dir))
    _train(model.medusa_head, work.lm_head.weight, seed)
    out.mkdir(parents=True)
    legacy.MedusaConfig(
        medusa_num_heads=n_heads, medusa_num_layers=1, base_model_name_or_path=BASE_NAME, version="2"
    ).save_pretrained(out)
    save_file(model.medusa_head.state_dict(), str(out / "medusa_lm_head.safetensors"))
    ref = legacy.MedusaModel(copy.deepcopy(base), n_heads, 1, str(base_dir))
    ref.medusa_head.load_state_dict(load_file(str(out / "medusa_lm_head.safetensors")), strict=False)
    ids = torch.from_numpy(np.random.default_rng(seed).integers(3, 256, (1, T)))
    with torch.no_grad():
        logits = ref(input_ids=ids)
    _record(out, ids, _features(base, ids), logits, base.lm_head.weight, shared=True)


def _add_medusa_heads(axolotl_src: Path):
    """ResBlock + add_medusa_heads from the axolotl fork's monkeypatch/medusa_utils.py, executed as
    written (the module itself imports wandb and axolotl; these two definitions need torch only)."""
    import math
    from typing import Optional

    import torch.nn.functional as F
    from torch import nn

    path = axolotl_src / "src/axolotl/monkeypatch/medusa_utils.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if getattr(n, "name", None) in ("ResBlock", "add_medusa_heads")]
    ns = {"torch": torch, "nn": nn, "F": F, "types": types, "math": math, "List": list, "Optional": Optional}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)
    return ns["add_medusa_heads"]


def medusa2(base, out: Path, axolotl_src: Path, n_heads: int, seed: int) -> None:
    """Medusa-2: add_medusa_heads on the (bf16) model, the whole model saved by save_pretrained;
    the reference reloads the folder as Medusa's from_pretrained does (the base, then the heads'
    tensors from the same weights file)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    add_medusa_heads = _add_medusa_heads(axolotl_src)
    model = copy.deepcopy(base).to(torch.bfloat16)
    add_medusa_heads(model, medusa_num_heads=n_heads, medusa_num_layers=1)
    _train(model.medusa_head, model.lm_head.weight, seed)
    model.save_pretrained(out)
    from tiny import tokenizer_files  # the tokenizer beside it (as Medusa-2 uploads are): a whole target

    tokenizer_files(out)
    ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    add_medusa_heads(ref, medusa_num_heads=n_heads, medusa_num_layers=1)
    heads = {k.removeprefix("medusa_head."): v for k, v in load_file(str(out / "model.safetensors")).items()}
    ref.medusa_head.load_state_dict({k: v for k, v in heads.items() if k[0].isdigit()}, strict=True)
    ids = torch.from_numpy(np.random.default_rng(seed).integers(3, 256, (1, T)))
    with torch.no_grad():
        logits = ref(input_ids=ids, medusa_return=True)[1:]  # [0] is the base LM head's
    _record(out, ids, _features(ref, ids), logits, ref.lm_head.weight)


_EDGESPEC_HEADS = """
import sys
import numpy as np
from transformers import AutoModelForCausalLM
from edgespec.export.drafters.medusa.checkpoint import save_heads
from edgespec.export.drafters.medusa.head import MedusaConfig, build_heads, random_heads

base, out = sys.argv[1], sys.argv[2]
lm = AutoModelForCausalLM.from_pretrained(base).lm_head.weight.detach().float().numpy()
d2t = np.sort(np.random.default_rng(7).choice(256, 48, replace=False))
mc = MedusaConfig(hidden_size=64, vocab_size=256, draft_vocab_size=48, n_heads=3, n_layers=1)
save_heads(build_heads(mc, random_heads(mc, d2t, seed=7), lm), out, {"target": base})
"""


def published(base, base_dir: Path, out: Path, python: str) -> None:
    """edgespec's way out: heads trained the edgespec way (random here, edgespec's layout: the target's
    LM head shared) written by `edgespec export-drafter --format medusa-official` (edgespec's own venv,
    `python`), then loaded by medusa-llm's MedusaModel as from_pretrained does. Kept: heads/ (the source;
    its medusa.target names the tests' tiny llama), published/ (what Medusa's class loaded) and
    reference.npz (features, Medusa's logits, the base's LM head, load_state_dict's missing and
    unexpected keys)."""
    import subprocess

    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    out.mkdir(parents=True)
    subprocess.run([python, "-c", _EDGESPEC_HEADS, str(base_dir), str(out / "heads")], check=True)
    subprocess.run(
        [python, "-m", "edgespec.cli", "export-drafter", str(out / "heads"), "--format", "medusa-official"]
        + ["--out", str(out / "published")],
        check=True,
    )
    cfg = json.loads((out / "heads/config.json").read_text())
    cfg["medusa"]["target"] = "tests/tiny.py make_tiny('llama')"  # a path of this run's temporary folder
    (out / "heads/config.json").write_text(json.dumps(cfg, indent=1))
    mc = MedusaConfig.from_pretrained(out / "published")
    model = MedusaModel(copy.deepcopy(base), mc.medusa_num_heads, mc.medusa_num_layers, str(base_dir))
    loaded = torch.load(out / "published/medusa_lm_head.pt", map_location="cpu")
    missing, unexpected = model.medusa_head.load_state_dict(loaded, strict=False)
    ids = torch.from_numpy(np.random.default_rng(8).integers(3, 256, (1, T)))
    with torch.no_grad():
        logits = model(input_ids=ids)
    _record(out, ids, _features(base, ids), logits, base.lm_head.weight, shared=True)
    pub = json.loads((out / "published/config.json").read_text())
    pub["base_model_name_or_path"] = BASE_NAME  # was this run's temporary folder
    (out / "published/config.json").write_text(json.dumps(pub, indent=2) + "\n")
    with np.load(out / "reference.npz") as z:
        ref = dict(z)
    np.savez(out / "reference.npz", **ref, missing=np.array(missing, str), unexpected=np.array(unexpected, str))


_SHIPPED_SIDE = """
import sys
import numpy as np
import torch
from edgespec.export.drafters.medusa.checkpoint import read_any
from edgespec.export.drafters.medusa.head import build_heads
from edgespec.export.drafters.medusa.publish import target_lm_head
from edgespec.export.target import sources

heads, out = sys.argv[1], sys.argv[2]
model, tok = sources.load(sources.resolve(None))
lm = model.lm_head.weight.detach().float().numpy()
read, _ = target_lm_head("smollm2-135m-instruct")
ids = torch.tensor([tok.encode("The capital of France is Paris. The capital of Italy is")])
with torch.no_grad():
    feats = model.model(input_ids=ids)[0][0].float().numpy()
mc, arrays = read_any(heads, 576, 49152)
h = build_heads(mc, arrays, lm)
with torch.no_grad():
    logits = h.logits(h(torch.from_numpy(feats))).numpy().transpose(1, 0, 2)  # [K, T, Vd]
np.savez(out, features=feats, logits=logits, d2t=arrays["d2t"], lm_read_equal=np.array(np.array_equal(lm, read)))
"""


def check_shipped(python: str) -> None:
    """The heads shipped for the default model, published (`edgespec export-drafter`) and loaded by
    medusa-llm's MedusaModel: their logits on the default model's features against edgespec's
    PyTorch heads on the same features (the default target itself is a GGUF, read by edgespec's venv;
    here only its LM head's shape is needed: the published heads carry the rows)."""
    import subprocess

    from medusa.model.medusa_model import MedusaConfig, MedusaModel
    from transformers import LlamaConfig, LlamaForCausalLM

    shipped = ROOT / "export/heads/smollm2-135m-instruct-medusa"
    with tempfile.TemporaryDirectory() as tmp:
        pub, side = Path(tmp) / "pub", Path(tmp) / "side.npz"
        cmd = [python, "-m", "edgespec.cli", "export-drafter", str(shipped), "--format", "medusa-official"]
        subprocess.run(cmd + ["--out", str(pub)], check=True)
        subprocess.run([python, "-c", _SHIPPED_SIDE, str(shipped), str(side)], check=True)
        mc = MedusaConfig.from_pretrained(pub)
        base_cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=8, num_hidden_layers=1)
        base = LlamaForCausalLM(base_cfg)  # a stand-in: MedusaModel reads its LM head's shape and dtype
        tok_dir = Path(tmp) / "tok"
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import tokenizer_files  # MedusaModel loads a tokenizer from base_model_name_or_path

        tokenizer_files(tok_dir)
        model = MedusaModel(base, mc.medusa_num_heads, mc.medusa_num_layers, str(tok_dir))
        missing, unexpected = model.medusa_head.load_state_dict(torch.load(pub / "medusa_lm_head.pt"), strict=False)
        with np.load(side) as z:
            feats, want, d2t, same = z["features"], z["logits"], z["d2t"], bool(z["lm_read_equal"])
        with torch.no_grad():  # MedusaModel.forward's heads, on the base's hidden states
            got = torch.stack([head(torch.from_numpy(feats)) for head in model.medusa_head]).numpy()
        size = (pub / "medusa_lm_head.pt").stat().st_size / 2**20
        print(
            f"shipped heads published ({size:.0f} MiB, {mc.medusa_num_heads} heads, base "
            f"{mc.base_model_name_or_path}); Medusa's load_state_dict: missing {missing}, unexpected {unexpected}; "
            f"the LM head export-drafter read == the target's as edgespec loads it: {same}; "
            f"max |Medusa - edgespec| over {len(feats)} positions x {len(d2t)} draft tokens: "
            f"{np.abs(got[:, :, d2t] - want).max():.2e}; greedy drafts equal: "
            f"{np.array_equal(got[:, :, d2t].argmax(-1), want.argmax(-1))}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "tests/fixtures/published"))
    p.add_argument("--medusa-src", default="/tmp/medusa_head_src", help="FasterDecoding/Medusa at HEAD")
    p.add_argument("--axolotl-src", default="/tmp/axolotl_src", help="ctlllll/axolotl at HEAD")
    p.add_argument("--edgespec-python", default=str(ROOT / ".venv/bin/python"), help="a python with edgespec")
    p.add_argument("--check-shipped", action="store_true", help="only publish the shipped heads and compare")
    a = p.parse_args()
    if a.check_shipped:
        check_shipped(a.edgespec_python)
        return 0
    out = Path(a.out)
    torch.manual_seed(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        base = _base(base_dir)
        jobs = {
            "pt-fp16": lambda o: medusa1(base, base_dir, o, 3, 1, torch.float16, "pt", 1),
            "pt-fp32-l2": lambda o: medusa1(base, base_dir, o, 2, 2, torch.float32, "pt", 2),
            "pt-fp32-l0": lambda o: medusa1(base, base_dir, o, 2, 0, torch.float32, "pt", 3),
            "st-bf16": lambda o: medusa1(base, base_dir, o, 3, 1, torch.bfloat16, "safetensors", 4),
            "medusa2-bf16": lambda o: medusa2(base, o, Path(a.axolotl_src), 2, 6),
            "publish": lambda o: published(base, base_dir, o, a.edgespec_python),
            "v2-st-bf16": lambda o: medusa_v2(base, base_dir, o, Path(a.medusa_src), 3, 5),  # last: swaps `medusa`
        }
        for name, job in jobs.items():
            folder = out / f"medusa-official-{name}"
            shutil.rmtree(folder, ignore_errors=True)
            job(folder)
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            print(f"{folder}: {sorted(f.name for f in folder.iterdir())} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
