"""Tiny EAGLE-3 heads written by their projects' own code, with those projects' own forward outputs,
for tests/test_published_eagle3.py (tests/fixtures/published/eagle3-*/).

Not run by CI: it needs the upstream code, which CI does not install. Each part runs under the
interpreter that has its project (the script starts itself again with --part):
  official     SafeAILab EAGLE (eagle/model/cnets.py Model; PyPI's eagle-llm 1.2.1 predates EAGLE-3, so a
               checkout of github.com/SafeAILab/EAGLE, --official-src) on transformers 4.x (its attention
               reads config.rope_scaling["type"], which transformers 5 rewrites): a venv with
               torch + transformers==4.53.3 (--official-python). Saved as its training saves
               (deepspeed save_16bit_model: the fp16 state dict without the frozen embedding, torch.save to
               pytorch_model.bin), config.json its traineagle3/config.json with tiny numbers.
  specforge    specforge 0.2.0 (LlamaForCausalLMEagle3) on its pinned transformers 5.8.1 (a venv with torch,
               transformers==5.8.1 and the specforge wheel --no-deps: --specforge-python), saved by its
               exporter specforge.export.to_hf (bf16, with the embedding) from a bf16 training_state.pt.
  speculators  speculators 0.9.0 (Eagle3DraftModel, Eagle3SpeculatorConfig), saved by save_pretrained in bf16.
  roundtrip    an edgespec head (head.py save_eagle3, edgespec's venv: --edgespec-python) written by
               `edgespec export-drafter` as speculators and eagle3-official, loaded by those projects'
               loaders, their logits recorded.

Every fixture is for a tiny Llama target (hidden 64, vocab 256, 8 layers: aux layers 2, 4, 5) and
holds reference.npz: tokens [N] and aux [N, n*Ht] (the head's inputs: row j reads aux_j and, at
draft step s = 1, 2, 3, tokens[j + s - 1]), embed [256, Ht] (the target embedding the upstream
forward used where the head has none of its own: the test gives its tiny target this table) and
logits_s1..s3 [n, Vd] (step s of the chain from each row j < n, the project's own forward in fp32 on
the stored weights widened), plus upstream.json: the project, version, class and dtype.

Run from the repository root, with speculators 0.9.0 (and its imports: openai, datasets, loguru,
pydantic-settings, hs-connectors) in the running interpreter:
  /work/scratch/venv/bin/python tools/published_fixtures/eagle3.py \
      --official-python /work/scratch/venv_eagle3/bin/python --official-src /path/to/EAGLE \
      --specforge-python /work/scratch/venv_specforge/bin/python --edgespec-python .venv/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SpecForge's norms are torch.compile'd: plain eager on CPU

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "published"
V, H, I, HEADS, KV_HEADS, VD = 256, 64, 128, 4, 2, 48  # the tiny target's vocabulary and width; the head's
N_ROWS = 12  # rows j whose chains are recorded
N = N_ROWS + 2  # rows fed (a chain from row j reads tokens up to j + 2)
AUX = (2, 4, 5)  # entering ids of the tiny 8-layer target (2, L//2, L-3)


def inputs(seed: int, ht: int = H, n_aux: int = 3):
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, N).astype(np.int64)
    aux = (rng.standard_normal((N, n_aux * ht)) * 2.0).astype(np.float32)
    # the target's embedding: one table for every fixture (the tests give their one tiny target this table)
    embed = (np.random.default_rng(0).standard_normal((V, ht)) * 0.5).astype(np.float32)
    vocab = np.sort(rng.permutation(V)[:VD]).astype(np.int64)  # the draft tokens (ascending, as EAGLE-3 builds them)
    return tokens, aux, embed, vocab


def randomize(model, seed: int) -> None:
    """Every float parameter random (norm weights around 1, so a missing norm shows)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            if name.endswith("norm.weight") or "norm." in name or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def vocab_maps(vocab):
    import torch

    d2t = torch.from_numpy(vocab - __import__("numpy").arange(len(vocab)))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.from_numpy(vocab)] = True
    return d2t, t2d


def fresh(name: str) -> Path:
    """The fixture folder `name`, made empty."""
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    return folder


def own_embedding(seed: int, width: int):
    """A head's own embedding table [V, width] (the heads that carry one)."""
    import numpy as np

    return (np.random.default_rng(seed + 7).standard_normal((V, width)) * 0.5).astype(np.float32)


def save_reference(folder: Path, data: tuple, steps: list, meta: dict) -> None:
    """The upstream forward's logits per draft step on `data` (tokens, aux, embed), and who computed
    them (meta, and the transformers version that ran); says it wrote the folder."""
    import numpy as np

    arrays = dict(zip(("tokens", "aux", "embed"), data, strict=True))
    arrays |= {f"logits_s{i + 1}": np.asarray(s, np.float32) for i, s in enumerate(steps)}
    np.savez_compressed(folder / "reference.npz", **arrays)
    meta = meta | {"transformers": __import__("transformers").__version__}
    (folder / "upstream.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {folder}")


# ---- official (SafeAILab EAGLE) --------------------------------------------------------------------
def official_model(folder: Path, embed, src: str):
    """The official Model loaded as ea_model.EaModel loads it: config.json through EConfig,
    pytorch_model.bin through load_state_dict(strict=False) (its embedding: the target's), fp32."""
    import torch

    sys.path.insert(0, src)
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    config = EConfig.from_pretrained(str(folder))
    model = Model(config, load_emb=False)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(torch.from_numpy(embed))  # load_emb: the target's table
    if config.vocab_size == config.draft_vocab_size:
        del model.d2t, model.t2d
    state = torch.load(folder / "pytorch_model.bin", map_location="cpu")
    model.load_state_dict(state, strict=False)
    return model.float().eval()


def official_chains(model, tokens, aux):
    """Steps 1..3 of the chain from each row j as its drafting (topK_genrate) runs them: the rows
    0..j with the target's features, then one row at a time fed the head's own output and KV cache."""
    import torch

    steps = [[], [], []]
    with torch.no_grad():
        for j in range(N_ROWS):
            ids = torch.from_numpy(tokens[None, : j + 1])
            out, kv = model(torch.from_numpy(aux[None, : j + 1]), ids, use_cache=True)
            steps[0].append(model.lm_head(model.norm(out[0, -1])).numpy())
            hidden = out[:, -1:]
            for s in (1, 2):
                out, kv = model(
                    hidden, torch.from_numpy(tokens[None, j + s : j + s + 1]), past_key_values=kv, use_cache=True
                )
                steps[s].append(model.lm_head(model.norm(out[0, -1])).numpy())
                hidden = out[:, -1:]
    return steps


def part_official(src: str) -> None:
    import torch
    from eagle.model.cnets import Model  # noqa: F401 - fails early without the source
    from eagle.model.configs import EConfig

    for name, dtype, seed in (("eagle3-official", torch.float16, 1),):
        folder = fresh(name)
        tokens, aux, embed, vocab = inputs(seed)
        cfg = json.loads((Path(src) / "eagle" / "traineagle3" / "config.json").read_text())
        cfg |= dict(
            hidden_size=H,
            intermediate_size=I,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            vocab_size=V,
            draft_vocab_size=VD,
            bos_token_id=None,
            eos_token_id=1,
            rms_norm_eps=1e-5,
        )
        model = Model(EConfig(**cfg), load_emb=False)
        randomize(model, seed)
        d2t, t2d = vocab_maps(vocab)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        # deepspeed's save_16bit_model(exclude_frozen_parameters=True): the module's 16-bit state dict
        # without the frozen embedding, torch.save'd as pytorch_model.bin
        model.embed_tokens.weight.requires_grad = False
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        state = {
            k: (v.to(dtype) if v.is_floating_point() else v) for k, v in model.state_dict().items() if k not in frozen
        }
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        steps = official_chains(official_model(folder, embed, src), tokens, aux)
        meta = {"project": "SafeAILab/EAGLE", "commit": git_head(src), "class": "eagle.model.cnets.Model"}
        save_reference(folder, (tokens, aux, embed), steps, meta | {"dtype": str(dtype)})


def git_head(src: str) -> str:
    """The EAGLE checkout's commit (an exported tree without .git: the one this script was last run with)."""
    try:
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        head = ""
    return head or "cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b (git archive)"


# ---- SpecForge ---------------------------------------------------------------------------------------
def specforge_chains(model, tokens, aux):
    """Training-time test as specforge.algorithms.eagle3 runs it (project_hidden_states, then per step
    embed_input_ids, backbone with the cached keys of the earlier steps, compute_logits; the next step
    reads the tokens one further and the step's own output)."""
    import torch

    n = len(tokens)
    with torch.no_grad():
        hidden = model.project_hidden_states(torch.from_numpy(aux[None]))
        mask = model.prepare_decoder_attention_mask(
            attention_mask=torch.ones(1, n, dtype=torch.bool),
            hidden_states=hidden,
            batch_size=1,
            seq_length=n,
            past_key_values_length=0,
        )
        pos = torch.arange(n)[None]
        cache = [[], []]
        steps = []
        for s in range(3):
            ids = torch.from_numpy(tokens[s:])
            ids = torch.cat([ids, torch.zeros(s, dtype=ids.dtype)])[None]
            out = model.backbone(
                input_embeds=model.embed_input_ids(ids),
                hidden_states=hidden,
                cache_hidden=cache,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=None,
                use_cache=True,
            )
            steps.append(model.compute_logits(out)[0, :N_ROWS].numpy())
            hidden = out
    return steps


def specforge_load(folder: Path):
    """The exported folder as SpecForge's trainer materializes a draft (AutoDraftModel.from_config, then
    the state dict): its from_pretrained, under transformers 5 on the meta device, leaves the attention's
    non-persistent RoPE caches (cos_cached, inv_freq) uninitialized, so its forward is NaN."""
    import torch
    from safetensors.torch import load_file
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(str(folder / "config.json")))
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return model.to(torch.float32).eval()


def part_specforge() -> None:
    import torch
    from specforge.export.to_hf import export_to_hf
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    variants = (
        # name, seed, config additions, target hidden (fc input width per layer)
        ("eagle3-specforge", 2, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}, H),
        (
            "eagle3-specforge-variants",
            3,
            {
                "fc_norm": True,
                "norm_output": False,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "target_hidden_size": H,
                "hidden_size": 32,
                "intermediate_size": 96,
                "head_dim": 8,
            },
            H,
        ),
    )
    for name, seed, extra, ht in variants:
        folder = fresh(name)
        tokens, aux, embed, vocab = inputs(seed, ht)
        base = dict(
            architectures=["LlamaForCausalLMEagle3"],
            hidden_size=H,
            intermediate_size=I,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            num_hidden_layers=1,
            vocab_size=V,
            draft_vocab_size=VD,
            rms_norm_eps=1e-5,
            hidden_act="silu",
            max_position_embeddings=2048,
            model_type="llama",
            pad_token_id=0,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
        )
        cfg = base | extra
        with tempfile.TemporaryDirectory() as tmp:
            cfg_path = Path(tmp) / "draft_config.json"
            cfg_path.write_text(json.dumps(cfg))
            model = LlamaForCausalLMEagle3(LlamaConfig(**{k: v for k, v in cfg.items()}))
            randomize(model, seed)
            d2t, t2d = vocab_maps(vocab)
            with torch.no_grad():
                model.embed_tokens.weight.copy_(torch.from_numpy(own_embedding(seed, cfg["hidden_size"])))
            # a training state as SpecForge's trainer keeps it: the draft in bf16 (its torch_dtype)
            sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if k not in ("d2t", "t2d")}
            sd |= {"d2t": d2t, "t2d": t2d}
            torch.save({"draft_state_dict": sd}, Path(tmp) / "training_state.pt")
            export_to_hf(str(Path(tmp) / "training_state.pt"), str(cfg_path), str(folder))
        save_reference(
            folder,
            (tokens, aux, embed),
            specforge_chains(specforge_load(folder), tokens, aux),
            {
                "project": "sgl-project/SpecForge",
                "version": "specforge 0.2.0",
                "class": "specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3",
                "dtype": "torch.bfloat16",
                "saved_by": "specforge.export.to_hf.export_to_hf",
            },
        )


# ---- speculators ---------------------------------------------------------------------------------------
def speculators_chains(model, tokens, aux):
    """Eagle3DraftModel.forward's training-time test over 3 steps; each step's logits caught at lm_head."""
    import torch

    got = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: got.append(o[0, :N_ROWS].detach().numpy()))
    with torch.no_grad():
        model(
            hidden_states=torch.from_numpy(aux[None]),
            input_ids=torch.from_numpy(tokens[None]),
            document_ids=torch.zeros(1, len(tokens), dtype=torch.long),
            ttt_steps=3,
        )
    hook.remove()
    return got


def speculators_load(folder: Path):
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    # its from_pretrained ends with load_verifier_weights, which reads the verifier's config even when
    # the checkpoint names none (ours: no verifier on disk) and fills only weights the checkpoint lacks
    # (NaN): skipped for a checkpoint without a verifier, the weights loaded are the checkpoint's
    verifier_weights = Eagle3DraftModel.load_verifier_weights
    Eagle3DraftModel.load_verifier_weights = lambda self: (
        None if self.config.speculators_config.verifier.name_or_path is None else verifier_weights(self)
    )
    model = Eagle3DraftModel.from_pretrained(str(folder), torch_dtype=torch.float32)
    Eagle3DraftModel.load_verifier_weights = verifier_weights
    model.config.transformer_layer_config._attn_implementation = "eager"  # dense masks on CPU  # noqa: SLF001
    model._attn_impl = "eager"  # noqa: SLF001
    from speculators.models.attention import create_float_mask

    model._create_mask_fn = create_float_mask  # noqa: SLF001
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = "eager"  # noqa: SLF001
    return model.eval()


def part_speculators() -> None:
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    variants = (
        ("eagle3-speculators", 4, {}, dict(rope_theta=10000.0)),
        (
            "eagle3-speculators-variants",
            5,
            dict(
                norm_before_residual=True,
                norm_before_fc=True,
                norm_output=True,
                eagle_aux_hidden_state_layer_ids=[2, 4, 5],
            ),
            dict(rope_parameters={"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0}),
        ),
        ("eagle3-speculators-fcnorm", 6, dict(fc_norm=True), dict(rope_theta=10000.0)),
    )
    for name, seed, top, rope in variants:
        folder = fresh(name)
        tokens, aux, embed, vocab = inputs(seed)
        layer = LlamaConfig(
            hidden_size=H,
            intermediate_size=I,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            num_hidden_layers=1,
            vocab_size=V,
            rms_norm_eps=1e-5,
            **rope,
        )
        layer._attn_implementation = "eager"  # noqa: SLF001
        cfg = Eagle3SpeculatorConfig(
            transformer_layer_config=layer,
            draft_vocab_size=VD,
            speculators_config=SpeculatorsConfig(
                algorithm="eagle3",
                proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                default_proposal_method="greedy",
                verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
            ),
            **{"norm_before_residual": False} | top,
        )
        model = Eagle3DraftModel(cfg)
        randomize(model, seed)
        d2t, t2d = vocab_maps(vocab)
        model.load_vocab_mappings(t2d, d2t)
        with torch.no_grad():  # from_training_args' load_verifier_weights would copy the verifier's
            model.embed_tokens.weight.copy_(torch.from_numpy(own_embedding(seed, H)))
        model.to(torch.bfloat16).save_pretrained(str(folder))
        for extra in folder.glob("*.py"):  # the config class's source, which save_pretrained copies beside it
            extra.unlink()
        save_reference(
            folder,
            (tokens, aux, embed),
            speculators_chains(speculators_load(folder), tokens, aux),
            {
                "project": "vllm-project/speculators",
                "version": "speculators 0.9.0",
                "class": "speculators.models.eagle3.Eagle3DraftModel",
                "dtype": "torch.bfloat16",
                "saved_by": "save_pretrained",
            },
        )


# ---- round trip: edgespec's own head -> export-drafter -> the upstream loaders -------------------------------
EDGESPEC_HEAD = """
import sys, numpy as np
from edgespec.export.drafters.eagle3.head import Eagle3Config, build_eagle3, save_eagle3
from edgespec.export.drafters._torch import HeadShape
rng = np.random.default_rng(8)
V, H, I, VD = 256, 64, 128, 48
ec = Eagle3Config(hidden_size=H, intermediate_size=I, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rms_norm_eps=1e-5, vocab_size=V, draft_vocab_size=VD, aux_layers=(2, 4, 5), rope_theta=10000.0)
shapes = {"fc.weight": (H, 3 * H), "lm_head.weight": (VD, H),
          "midlayer.self_attn.q_proj.weight": (64, 2 * H), "midlayer.self_attn.k_proj.weight": (32, 2 * H),
          "midlayer.self_attn.v_proj.weight": (32, 2 * H), "midlayer.self_attn.o_proj.weight": (H, 64),
          "midlayer.mlp.gate_proj.weight": (I, H), "midlayer.mlp.up_proj.weight": (I, H),
          "midlayer.mlp.down_proj.weight": (H, I)}
arrays = {k: (rng.standard_normal(s) / s[-1] ** 0.5).astype(np.float32) for k, s in shapes.items()}
for k in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
          "norm.weight"):
    arrays[k] = (1 + 0.2 * rng.standard_normal(H)).astype(np.float32)
arrays["d2t"] = np.sort(rng.permutation(V)[:VD]).astype(np.int64)
embed = np.zeros((V, H), np.float32)
cos = np.ones((8, 16), np.float32)
head = build_eagle3(ec, arrays, embed, cos, 0 * cos)
save_eagle3(head, sys.argv[1], {"fixture": "tools/published_fixtures/eagle3.py"})
"""


def digest(tensors: dict) -> str:
    """sha256 over the tensors' names and float32 values, in name order (what a loader read)."""
    import numpy as np

    h = hashlib.sha256()
    for k in sorted(tensors):
        a = np.ascontiguousarray(
            np.asarray(tensors[k], np.float32 if np.asarray(tensors[k]).dtype.kind == "f" else np.int64)
        )
        h.update(k.encode() + a.tobytes())
    return h.hexdigest()


def part_roundtrip_write(edgespec_python: str) -> Path:
    folder = fresh("eagle3-edgespec")
    subprocess.run([edgespec_python, "-c", EDGESPEC_HEAD, str(folder)], check=True)
    tokens, aux, embed, _ = inputs(9)
    import numpy as np

    np.savez_compressed(folder / "inputs.npz", tokens=tokens, aux=aux, embed=embed)
    for fmt in ("speculators", "eagle3-official"):
        out = Path(tempfile.mkdtemp()) / fmt
        subprocess.run(
            [edgespec_python, "-m", "edgespec.cli", "export-drafter", str(folder), "--format", fmt, "--out", str(out)],
            check=True,
        )
        (folder.parent / f".roundtrip-{fmt}").write_text(str(out))
    return folder


def part_roundtrip_load(fmt: str, src: str | None) -> None:
    import numpy as np
    import torch

    folder = OUT / "eagle3-edgespec"
    out = Path((folder.parent / f".roundtrip-{fmt}").read_text())
    d = np.load(folder / "inputs.npz")
    tokens, aux, embed = d["tokens"], d["aux"], d["embed"]
    if fmt == "speculators":
        model = speculators_load(out)
        with torch.no_grad():  # no table of its own: the verifier's (vLLM shares the target's)
            model.embed_tokens.weight.copy_(torch.from_numpy(embed))
        steps = speculators_chains(model, tokens, aux)
        loaded = {
            k: v for k, v in model.state_dict().items() if not k.startswith("verifier_") and k != "embed_tokens.weight"
        }
    else:
        model = official_model(out, embed, src)
        steps = official_chains(model, tokens, aux)
        loaded = {k: v for k, v in model.state_dict().items() if k != "embed_tokens.weight"}
    result = {f"{fmt}_logits_s{i + 1}": np.asarray(s, np.float32) for i, s in enumerate(steps)}
    np.savez_compressed(
        folder / f"published-{fmt}.npz", digest=np.array(digest({k: v.numpy() for k, v in loaded.items()})), **result
    )
    print(f"recorded {fmt} logits of the published copy of {folder}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--part",
        choices=["all", "official", "specforge", "speculators", "roundtrip-write", "roundtrip-load"],
        default="all",
    )
    p.add_argument("--format", default="speculators", help="roundtrip-load: which published copy")
    p.add_argument("--official-python", default="/work/scratch/venv_eagle3/bin/python")
    p.add_argument("--official-src", default="/work/scratch/eagle3_official")
    p.add_argument("--specforge-python", default="/work/scratch/venv_specforge/bin/python")
    p.add_argument("--edgespec-python", default=".venv/bin/python")
    a = p.parse_args()
    if a.part == "official" or (a.part == "roundtrip-load" and a.format == "eagle3-official"):
        sys.path.insert(0, a.official_src)
    if a.part == "official":
        part_official(a.official_src)
    elif a.part == "specforge":
        part_specforge()
    elif a.part == "speculators":
        part_speculators()
    elif a.part == "roundtrip-write":
        part_roundtrip_write(a.edgespec_python)
    elif a.part == "roundtrip-load":
        part_roundtrip_load(a.format, a.official_src)
    else:
        me = [sys.argv[0]]
        common = ["--official-src", a.official_src, "--edgespec-python", a.edgespec_python]
        run = lambda py, *args: subprocess.run([py, *me, *args, *common], check=True)  # noqa: E731
        run(a.official_python, "--part", "official")
        run(a.specforge_python, "--part", "specforge")
        run(sys.executable, "--part", "speculators")
        run(sys.executable, "--part", "roundtrip-write")
        run(sys.executable, "--part", "roundtrip-load", "--format", "speculators")
        run(a.official_python, "--part", "roundtrip-load", "--format", "eagle3-official")
        for f in OUT.glob(".roundtrip-*"):
            f.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
