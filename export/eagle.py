"""EAGLE head: the module, its checkpoint layout, and training by self-distillation (torch).

The head (EAGLE-1 form) drafts from the target's own features. For the pair at position j:
    x_j   = fc([embed(token_{j+1}) ; f_j])            # [2H] -> [H]; f_j = target hidden at j
    f^_{j+1} = DecoderLayer(x_j)                         # one Llama layer, its own KV
    logits   = f^_{j+1} . lm_head_d^T                    # the target's LM head rows of the draft vocab
so the head predicts the target's next feature, and from it token_{j+2}. At draft time the
predicted feature stands in for the unknown true one, step after step. Features are the target's
post-final-norm hidden states (what the ONNX graphs output as `hidden`).

Checkpoint layout (Hugging Face, as EAGLE-1 heads are published): `config.json` (a LlamaConfig
with num_hidden_layers=1) + `model.safetensors` with parameter names
    fc.weight [H, 2H], fc.bias [H],
    layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.post_attention_layernorm.weight,
    layers.0.mlp.{gate,up,down}_proj.weight
(EAGLE-1's layer 0 has no input_layernorm; a checkpoint that has one is read and used). A
reduced draft vocabulary is stored as EAGLE-3 does: `d2t` [Vd] int64 with target_id = i + d2t[i],
`draft_vocab_size` in config.json. Heads trained here list their draft tokens most frequent first
(config.json `eagle.d2t_order: "frequency"`), so an export can keep a prefix: a cheaper head call
(`prune_draft_vocab`, `edgespec export --eagle-draft-vocab`). The embedding and the LM head rows
are the target's (frozen), so they are not stored unless the checkpoint brings its own
`embed_tokens.weight` / `lm_head.weight`.

Training (`train`): teacher-forced pairs over the target's own answers (`eagle_data`), plus a
second "training-time test" step (EAGLE-3) in which each row is fed the head's own predicted
feature, attending to the true rows before it and to itself: what drafting does at depth 2.
Loss per step = SmoothL1(f^, f) + ce_weight * CE(logits, target's own next token), over the
answer positions only.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HEAD_WEIGHTS = "model.safetensors"
HEAD_CONFIG = "config.json"


class HeadFormatError(ValueError):
    """A head checkpoint that is not in the EAGLE layout or does not fit the target."""


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int  # H: the target's hidden size
    intermediate_size: int  # MLP width of the head's decoder layer
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (GQA)
    head_dim: int  # per-head width
    rms_norm_eps: float  # RMSNorm epsilon
    vocab_size: int  # target vocabulary
    draft_vocab_size: int  # tokens the head can propose (<= vocab_size; the most frequent ones)
    input_layernorm: bool = False  # EAGLE-1 heads have none; True keeps a norm before attention
    final_norm: bool = False  # RMSNorm on the output (EAGLE-3's `norm`): predictions on the scale of
    #                           the target's post-norm features from the first step of training
    d2t_by_frequency: bool = False  # d2t lists the draft tokens most frequent first (heads trained here),
    #                                 so any prefix of it is a smaller draft vocabulary (prune_draft_vocab)


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig, embed: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor,
                 rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
        super().__init__()
        self.cfg = cfg
        H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.q_proj = nn.Linear(H, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(H, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(H, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, H, bias=False)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.post_ln = nn.Parameter(torch.ones(H))
        self.input_ln = nn.Parameter(torch.ones(H)) if cfg.input_layernorm else None
        self.norm = nn.Parameter(torch.ones(H)) if cfg.final_norm else None
        # frozen, from the target: embedding [V, H], LM head rows of the draft vocab [Vd, H]
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        self.register_buffer("d2t", d2t, persistent=False)  # [Vd] draft id -> target id
        self.register_buffer("rope_cos", rope_cos, persistent=False)  # [max_pos, D]
        self.register_buffer("rope_sin", rope_sin, persistent=False)

    # ---- pieces ----------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps) * w

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x [B, L, heads, D], pos [B, L]; HF rotate_half convention
        cos, sin = self.rope_cos[pos].unsqueeze(2), self.rope_sin[pos].unsqueeze(2)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def qkv(self, tokens: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor):
        """Input rows -> (residual x, rotated q [B,L,Hq,D], k, v [B,L,Hkv,D])."""
        c = self.cfg
        x = self.fc(torch.cat([self.embed[tokens], feats], dim=-1))
        h = self._norm(x, self.input_ln) if self.input_ln is not None else x
        B, L, _ = x.shape
        q = self._rope(self.q_proj(h).view(B, L, c.num_attention_heads, c.head_dim), pos)
        k = self._rope(self.k_proj(h).view(B, L, c.num_key_value_heads, c.head_dim), pos)
        v = self.v_proj(h).view(B, L, c.num_key_value_heads, c.head_dim)
        return x, q, k, v

    def finish(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Attention context [B, L, Hq*D] -> the layer's output (predicted feature) [B, L, H]."""
        x = x + self.o_proj(ctx)
        h = self._norm(x, self.post_ln)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return self._norm(x, self.norm) if self.norm is not None else x

    def logits(self, pred: torch.Tensor) -> torch.Tensor:
        return pred @ self.lm_head.T  # [.., Vd]

    def _expand(self, t: torch.Tensor) -> torch.Tensor:  # [B, L, Hkv, D] -> [B, Hq, L, D]
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return t.repeat_interleave(rep, dim=2).transpose(1, 2)

    # ---- training forward: step 1 teacher-forced, step 2 on its own features ---------------------
    def forward(self, tokens, feats, pos, valid, n_steps: int = 2) -> list[torch.Tensor]:
        """tokens [B, L] (token_{j+1}), feats [B, L, H] (f_j), pos [B, L] (= j), valid [B, L] bool.
        Returns the predicted features of each step: step s row j predicts f_{j+s}."""
        B, L = tokens.shape
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        key_ok = causal[None, None] & valid[:, None, None, :]  # [B, 1, L, L]
        x, q, k, v = self.qkv(tokens, feats, pos)
        K, V = self._expand(k), self._expand(v)  # true rows, [B, Hq, L, D]
        ctx = F.scaled_dot_product_attention(q.transpose(1, 2), K, V, attn_mask=key_ok, scale=scale)
        pred = self.finish(x, ctx.transpose(1, 2).reshape(B, L, -1))
        preds = [pred]
        for s in range(1, n_steps):
            # row j: pair (f^_{j+s}, token_{j+s+1}) at position j+s; it sees the true rows
            # 0..j (EAGLE: the accepted context) and its own speculative chain j+1..j+s-1 is
            # approximated by itself only (2 steps: exact)
            nxt = torch.roll(tokens, -s, dims=1)
            xs, qs, ks, vs = self.qkv(nxt, preds[-1], pos + s)
            Qs = qs.transpose(1, 2)  # [B, Hq, L, D]
            s_true = (Qs @ K.transpose(-1, -2)) * scale  # [B, Hq, L, L]
            s_true = s_true.masked_fill(~key_ok, float("-inf"))  # true rows 0..j
            s_self = (Qs * self._expand(ks)).sum(-1, keepdim=True) * scale  # [B, Hq, L, 1]
            w = torch.softmax(torch.cat([s_true, s_self], dim=-1), dim=-1)
            ctx = w[..., :L] @ V + w[..., L:] * self._expand(vs)
            preds.append(self.finish(xs, ctx.transpose(1, 2).reshape(B, L, -1)))
        return preds


# ---- checkpoint layout ---------------------------------------------------------------------------
_LAYER_NAMES = {"q_proj": "layers.0.self_attn.q_proj.weight", "k_proj": "layers.0.self_attn.k_proj.weight",
                "v_proj": "layers.0.self_attn.v_proj.weight", "o_proj": "layers.0.self_attn.o_proj.weight",
                "gate_proj": "layers.0.mlp.gate_proj.weight", "up_proj": "layers.0.mlp.up_proj.weight",
                "down_proj": "layers.0.mlp.down_proj.weight"}


def head_state(head: EagleHead) -> dict[str, np.ndarray]:
    """The head's own parameters under EAGLE checkpoint names (float32 numpy)."""
    out = {"fc.weight": head.fc.weight, "fc.bias": head.fc.bias,
           "layers.0.post_attention_layernorm.weight": head.post_ln}
    out |= {hf: getattr(head, attr).weight for attr, hf in _LAYER_NAMES.items()}
    if head.input_ln is not None:
        out["layers.0.input_layernorm.weight"] = head.input_ln
    if head.norm is not None:
        out["norm.weight"] = head.norm
    arrays = {k: v.detach().float().cpu().numpy() for k, v in out.items()}
    if head.cfg.draft_vocab_size < head.cfg.vocab_size:
        d2t = head.d2t.cpu().numpy().astype(np.int64)
        arrays["d2t"] = d2t - np.arange(len(d2t))  # EAGLE-3 convention: target = i + d2t[i]
    return arrays


def save_head(head: EagleHead, folder: str | Path, extra: dict | None = None) -> Path:
    """config.json (LlamaConfig fields + draft_vocab_size) + model.safetensors in float16."""

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = head.cfg
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
              "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
              "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
              "draft_vocab_size": c.draft_vocab_size, "bias": True, "hidden_act": "silu",
              "torch_dtype": "float16",
              "eagle": {"version": 1, "features": "final_norm", "input_layernorm": c.input_layernorm,
                        "final_norm": c.final_norm}
              | ({"d2t_order": "frequency"} if c.d2t_by_frequency else {}) | (extra or {})}
    return write_checkpoint(folder, head_state(head), config)


def write_checkpoint(folder: Path, arrays: dict[str, np.ndarray], config: dict) -> Path:
    """config.json + model.safetensors (float weights in fp16, int64 maps as they are); the weights
    go through a temporary name, so an interrupted save leaves no half file under the real one."""
    from safetensors.numpy import save_file

    arrays = {k: (v if v.dtype == np.int64 else v.astype(np.float16)) for k, v in arrays.items()}
    tmp = folder / (HEAD_WEIGHTS + ".tmp")
    save_file(arrays, str(tmp))
    tmp.rename(folder / HEAD_WEIGHTS)
    (folder / HEAD_CONFIG).write_text(json.dumps(config, indent=1))
    return folder


def read_head(folder: str | Path, hidden_size: int, vocab_size: int) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """Read and check an EAGLE-layout head against the target's sizes; float32 arrays + d2t (absolute)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    if not (folder / HEAD_CONFIG).exists():
        raise HeadFormatError(f"{folder}: no {HEAD_CONFIG}; an EAGLE head folder holds config.json + "
                              f"{HEAD_WEIGHTS} (or pytorch_model.bin)")
    cfg = json.loads((folder / HEAD_CONFIG).read_text())
    if (folder / HEAD_WEIGHTS).exists():
        w = load_file(str(folder / HEAD_WEIGHTS))
    elif (folder / "pytorch_model.bin").exists():
        w = {k: v.numpy() for k, v in torch.load(folder / "pytorch_model.bin", map_location="cpu").items()}
    else:
        raise HeadFormatError(f"{folder}: neither {HEAD_WEIGHTS} nor pytorch_model.bin")
    if any(k.startswith("midlayer.") for k in w):
        raise HeadFormatError(f"{folder}: an EAGLE-3 checkpoint (midlayer.*, fused low/mid/high features); "
                              "only EAGLE-1/2 heads (fc + layers.0) are supported")
    need = ["fc.weight", "layers.0.post_attention_layernorm.weight", *_LAYER_NAMES.values()]
    missing = [k for k in need if k not in w]
    if missing:
        raise HeadFormatError(f"{folder}: missing tensors {missing}; expected EAGLE-1 names (fc.*, layers.0.*)")
    H = int(cfg["hidden_size"])
    if H != hidden_size or tuple(w["fc.weight"].shape) != (H, 2 * H):
        raise HeadFormatError(f"{folder}: head hidden size {H} (fc {tuple(w['fc.weight'].shape)}) does not fit "
                              f"the target's hidden size {hidden_size}; was it trained for another model?")
    if int(cfg.get("vocab_size", vocab_size)) != vocab_size:
        raise HeadFormatError(f"{folder}: head vocab {cfg['vocab_size']} != target vocab {vocab_size}")
    n_h = int(cfg["num_attention_heads"])
    hc = HeadConfig(hidden_size=H, intermediate_size=int(cfg["intermediate_size"]), num_attention_heads=n_h,
                    num_key_value_heads=int(cfg.get("num_key_value_heads", n_h)),
                    head_dim=int(cfg.get("head_dim") or H // n_h), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                    vocab_size=vocab_size, draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab_size),
                    input_layernorm="layers.0.input_layernorm.weight" in w, final_norm="norm.weight" in w,
                    d2t_by_frequency="d2t" in w and (cfg.get("eagle") or {}).get("d2t_order") == "frequency")
    out = {k: v.astype(np.float32) for k, v in w.items() if k not in ("d2t", "t2d")}
    if "fc.bias" not in out:
        out["fc.bias"] = np.zeros(H, np.float32)
    if "d2t" in w:
        d2t = w["d2t"].astype(np.int64) + np.arange(len(w["d2t"]))
        if len(d2t) != hc.draft_vocab_size or d2t.min() < 0 or d2t.max() >= vocab_size:
            raise HeadFormatError(f"{folder}: d2t has {len(d2t)} entries / ids outside 0..{vocab_size - 1}")
    elif hc.draft_vocab_size == vocab_size:
        d2t = np.arange(vocab_size, dtype=np.int64)
    else:
        raise HeadFormatError(f"{folder}: draft_vocab_size {hc.draft_vocab_size} < vocab but no d2t tensor")
    out["d2t"] = d2t
    return hc, out


def prune_draft_vocab(hc: HeadConfig, arrays: dict[str, np.ndarray], n: int) -> tuple[HeadConfig, dict]:
    """The head over its n most frequent draft tokens (n <= 0 or >= its size: unchanged). Nothing
    to retrain: the LM-head rows are the target's, so the kept tokens' logits are the same; the
    head's argmax can no longer land on a dropped (rare) token, and each call streams fewer rows."""
    if n <= 0 or n >= hc.draft_vocab_size:
        return hc, arrays
    if not hc.d2t_by_frequency:
        raise HeadFormatError(f"cannot cut this head's draft vocabulary from {hc.draft_vocab_size} to {n} tokens: "
                              "its d2t is not in frequency order (heads from `edgespec train-eagle` record it "
                              "as eagle.d2t_order in config.json). Hint: --eagle-draft-vocab 0 keeps all of it")
    return replace(hc, draft_vocab_size=n), arrays | {"d2t": arrays["d2t"][:n]}


def build_head(hc: HeadConfig, arrays: dict[str, np.ndarray], embed: np.ndarray, lm_head: np.ndarray,
               rope_cos: np.ndarray, rope_sin: np.ndarray) -> EagleHead:
    """An EagleHead from checkpoint arrays and the target's embedding / LM head [V, H] / rope tables."""
    d2t = torch.from_numpy(arrays["d2t"])
    head = EagleHead(hc, torch.from_numpy(embed), torch.from_numpy(lm_head)[d2t].clone(), d2t,
                     torch.from_numpy(rope_cos), torch.from_numpy(rope_sin))
    with torch.no_grad():
        head.fc.weight.copy_(torch.from_numpy(arrays["fc.weight"]))
        head.fc.bias.copy_(torch.from_numpy(arrays["fc.bias"]))
        head.post_ln.copy_(torch.from_numpy(arrays["layers.0.post_attention_layernorm.weight"]))
        if head.input_ln is not None:
            head.input_ln.copy_(torch.from_numpy(arrays["layers.0.input_layernorm.weight"]))
        if head.norm is not None:
            head.norm.copy_(torch.from_numpy(arrays["norm.weight"]))
        for attr, hf in _LAYER_NAMES.items():
            getattr(head, attr).weight.copy_(torch.from_numpy(arrays[hf]))
    return head


# ---- training --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainConfig:
    data: str  # folder of eagle_data shards
    out: str  # head folder (config.json + model.safetensors) and checkpoint.pt
    target: str | None = None  # model source (None: default SmolLM2)
    draft_vocab: int = 8192  # most frequent answer tokens the head may propose (0: full vocab)
    init: str | None = None  # start from this head folder's weights and draft vocabulary (fine-tuning:
    #                          a fresh optimizer and schedule); ignored when `out` holds a checkpoint
    minutes: float = 30.0  # wall-clock budget of this run (training resumes from checkpoint.pt)
    epochs: float = 3.0  # passes over the data in total (across runs)
    lr: float = 1e-3  # AdamW peak learning rate (cosine decay over all epochs)
    batch_tokens: int = 4096  # tokens per optimizer step (sequences padded to the longest)
    ce_weight: float = 1.0  # token cross-entropy weight next to the feature regression
    n_steps: int = 2  # unrolled drafting steps per row (2 = EAGLE-3's training-time test)
    feature_noise: float = 0.05  # Gaussian noise on input features, in per-dimension standard deviations
    skip_copies: bool = True  # no loss where the answer repeats an 8-gram of its own context (loops;
    #                           False: `eagle` alone learns to continue them too)
    holdout: float = 0.05  # fraction of sequences kept out for the acceptance estimate
    threads: int | None = None  # torch threads
    seed: int = 0  # data order and init


def _target_tensors(target: str | None):
    """(arch, embed [V, H], lm_head [V, H], last layer weights, rope cos/sin) of the target, as the
    int4 engine computes with them (dequantized)."""
    from edgespec.export.arch import arch_from_config
    from edgespec.export.eagle_data import reference_model

    model, _ = reference_model(target)
    arch = arch_from_config(model.config, 2048)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    embed = sd["model.embed_tokens.weight"]
    lm_head = model.lm_head.weight.detach().float().numpy()
    cos, sin = arch.rope_tables()
    return arch, embed, lm_head, sd, cos.astype(np.float32), sin.astype(np.float32)


def init_arrays(arch, sd: dict, d2t: np.ndarray, seed: int) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """A new head: decoder layer copied from the target's last layer; fc passes the feature through
    (identity on the feature half, small random on the embedding half)."""
    H = arch.hidden_size
    rng = np.random.default_rng(seed)
    last = f"model.layers.{arch.n_layers - 1}."
    hc = HeadConfig(hidden_size=H, intermediate_size=arch.intermediate_size, num_attention_heads=arch.n_heads,
                    num_key_value_heads=arch.n_kv_heads, head_dim=arch.head_dim, rms_norm_eps=arch.rms_norm_eps,
                    vocab_size=arch.vocab_size, draft_vocab_size=len(d2t), input_layernorm=True, final_norm=True)
    fc = np.concatenate([rng.normal(0, 0.02, (H, H)), np.eye(H)], axis=1).astype(np.float32)
    arrays = {"fc.weight": fc, "fc.bias": np.zeros(H, np.float32), "d2t": d2t,
              "layers.0.post_attention_layernorm.weight": sd[last + "post_attention_layernorm.weight"],
              "layers.0.input_layernorm.weight": sd[last + "input_layernorm.weight"],
              "norm.weight": sd["model.norm.weight"]}
    for hf in _LAYER_NAMES.values():
        arrays[hf] = sd[last + hf.split("layers.0.", 1)[1]]
    return hc, arrays


def draft_vocab(tokens: np.ndarray, answer: np.ndarray, vocab: int, size: int) -> np.ndarray:
    """The `size` most frequent tokens of the answers, most frequent first (a prefix is then a
    smaller draft vocabulary), or the full vocabulary (ids in order)."""
    if size <= 0 or size >= vocab:
        return np.arange(vocab, dtype=np.int64)
    return by_frequency(np.arange(vocab, dtype=np.int64), tokens[answer], vocab)[:size]


def by_frequency(ids: np.ndarray, seen: np.ndarray, vocab: int) -> np.ndarray:
    """ids reordered by how often they occur in `seen`, most frequent first (ties: in given order)."""
    counts = np.bincount(seen.astype(np.int64), minlength=vocab)
    return ids[np.argsort(-counts[ids], kind="stable")].astype(np.int64)


def _batches(starts: np.ndarray, seqs: np.ndarray, batch_tokens: int, rng: np.random.Generator):
    """Groups of sequences of similar length whose padded size stays within batch_tokens."""
    lens = starts[seqs + 1] - starts[seqs]
    order = seqs[np.argsort(lens + rng.uniform(0, 8, len(lens)))]
    groups, cur, longest = [], [], 0
    for s in order:
        n = int(starts[s + 1] - starts[s])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


def copied_positions(tokens: np.ndarray, starts: np.ndarray, n: int = 8) -> np.ndarray:
    """[N] bool: the token ends an n-gram that already occurred earlier in its sequence. Greedy
    answers of a small model loop a lot; such copies are prompt lookup's job, and training on
    them teaches the head little and inflates its held-out score."""
    out = np.zeros(len(tokens), bool)
    for s in range(len(starts) - 1):
        a, b = int(starts[s]), int(starts[s + 1])
        seen: set = set()
        seq = tokens[a:b].tolist()
        for i in range(n - 1, len(seq)):
            key = tuple(seq[i - n + 1:i + 1])
            out[a + i] = key in seen
            seen.add(key)
    return out


def _collate(group, tokens, feats, starts, n_prompt, t2d, label_ids=None):
    """Rows j = 0..n-2 of each sequence: input (token_{j+1}, f_j); step-s targets f_{j+s}, token_{j+s+1}."""
    L = max(int(starts[s + 1] - starts[s]) for s in group) - 1
    B = len(group)
    tok_in = np.zeros((B, L), np.int64)
    f_in = np.zeros((B, L + 2, feats.shape[1]), np.float32)
    labels = np.full((B, L + 2), -100, np.int64)  # draft-vocab id of token_{j+2}, -100: no loss
    valid = np.zeros((B, L), bool)
    for r, s in enumerate(group):
        a, b = int(starts[s]), int(starts[s + 1])
        n = b - a
        tok_in[r, :n - 1] = tokens[a + 1:b]
        f_in[r, :n] = feats[a:b]
        valid[r, :n - 1] = True
        lab = t2d[(tokens if label_ids is None else label_ids)[a + 2:b]]  # row j predicts token_{j+2}
        lab[: max(0, int(n_prompt[s]) - 2)] = -100  # prompt tokens: context only, no loss
        labels[r, :n - 2] = lab
    pos = np.broadcast_to(np.arange(L), (B, L)).copy()
    return (torch.from_numpy(tok_in), torch.from_numpy(f_in), torch.from_numpy(pos), torch.from_numpy(valid),
            torch.from_numpy(labels))


def _step_losses(head: EagleHead, batch, n_steps: int, ce_weight: float, inv_std: torch.Tensor,
                 noise: float = 0.0):
    tok_in, f_in, pos, valid, labels = batch
    L = tok_in.shape[1]
    feats = f_in[:, :L]
    if noise:  # the runtime's features come from int8-activation kernels, not this fp32 model
        feats = feats + torch.randn_like(feats) * (noise / inv_std)
    preds = head(tok_in, feats, pos, valid, n_steps)
    total, stats = 0.0, []
    for s, pred in enumerate(preds, start=1):
        lab = labels[:, s - 1:s - 1 + L]  # step s row j: token_{j+s+1}
        mask = lab >= 0
        if s > 1:
            mask = mask & torch.roll(valid, -(s - 1), dims=1)
        if not mask.any():
            continue
        target = f_in[:, s:s + L]
        # per-dimension scaled: a few feature dims are ~30x the others and would own the loss
        reg = F.smooth_l1_loss(pred[mask] * inv_std, target[mask] * inv_std)
        logits = head.logits(pred[mask])
        ce = F.cross_entropy(logits, lab[mask])
        acc = (logits.argmax(-1) == lab[mask]).float().mean()
        total = total + reg + ce_weight * ce
        stats.append((reg.item(), ce.item(), acc.item(), int(mask.sum())))
    return total, stats


def training_data(cfg):
    """What EAGLE and Medusa training share (cfg: threads, seed, out, data, holdout): torch set
    up, the out folder made, the shards loaded and split by sequence. Returns (out folder, rng,
    (tokens, features, starts, n_prompt), held-out sequences, training sequences, answer mask [N])."""
    from edgespec.export.eagle_data import load_shards

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens, feats, starts, n_prompt = load_shards(cfg.data)
    n_seq = len(n_prompt)
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(n_seq)
    n_hold = max(1, int(n_seq * cfg.holdout))
    hold, train_seqs = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    answer = np.zeros(len(tokens), bool)
    for s in range(n_seq):
        answer[starts[s] + n_prompt[s]:starts[s + 1]] = True
    return out, rng, (tokens, feats, starts, n_prompt), hold, train_seqs, answer


def train(cfg: TrainConfig, progress: bool = True) -> Path:
    """Train (or continue training) a head; writes the HF-layout head folder and checkpoint.pt."""
    out, rng, (tokens, feats, starts, n_prompt), hold, train_seqs, answer = training_data(cfg)
    n_seq, n_hold = len(n_prompt), len(hold)
    copied = copied_positions(tokens, starts) if cfg.skip_copies else np.zeros(len(tokens), bool)
    arch, embed, lm_head, sd, cos, sin = _target_tensors(cfg.target)
    ckpt_path = out / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
    # a resumed run keeps its draft vocabulary; its weights come from the checkpoint below
    if ckpt is None and cfg.init:  # fine-tuning an existing head: its weights and draft vocabulary
        hc, arrays = read_head(cfg.init, arch.hidden_size, arch.vocab_size)
    else:
        d2t = ckpt["d2t"] if ckpt is not None else draft_vocab(tokens, answer, arch.vocab_size, cfg.draft_vocab)
        hc, arrays = init_arrays(arch, sd, d2t, cfg.seed)
    if hc.draft_vocab_size < arch.vocab_size:  # most frequent first (also a resumed head's: the weights
        # do not depend on the order, the LM-head rows are gathered from the target by d2t)
        arrays["d2t"] = by_frequency(arrays["d2t"], tokens[answer], arch.vocab_size)
        hc = replace(hc, d2t_by_frequency=True)
    head = build_head(hc, arrays, embed, lm_head, cos, sin)
    coverage = float(np.isin(tokens[answer], head.d2t.numpy()).mean())
    t2d = np.full(arch.vocab_size + 1, -100, np.int64)
    t2d[head.d2t.numpy()] = np.arange(hc.draft_vocab_size)
    # labels: the token id itself, or vocab_size (-> -100) where the target was copying
    label_ids = np.where(copied, arch.vocab_size, tokens).astype(np.int64)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    step, epoch_f = 0, 0.0
    if ckpt is not None:
        head.load_state_dict(ckpt["head"], strict=False)
        opt.load_state_dict(ckpt["opt"])
        step, epoch_f = ckpt["step"], ckpt["epoch"]
    sample = feats[rng.choice(len(feats), min(len(feats), 20000), replace=False)].astype(np.float32)
    inv_std = torch.from_numpy(1.0 / (sample.std(0) + 1e-3))
    n_train_tokens = int(sum(starts[s + 1] - starts[s] for s in train_seqs))
    total_steps = max(1, int(cfg.epochs * n_train_tokens / cfg.batch_tokens * 1.3))  # padding slack
    print(f"[train] {int((answer & ~copied).sum())} answer tokens carry loss "
          + (f"({int((answer & copied).sum())} repeat an earlier 8-gram of their sequence: left to prompt lookup)"
             if cfg.skip_copies else "(loops included: --no-skip-copies)"), file=sys.stderr)
    print(f"[train] {n_seq} sequences ({len(tokens)} tokens, {int(answer.sum())} answer tokens), "
          f"{n_hold} held out; draft vocab {hc.draft_vocab_size} covers {coverage:.1%} of answer tokens"
          + (f"; resuming at step {step}" if ckpt is not None else f"; starting from {cfg.init}" if cfg.init else ""),
          file=sys.stderr)
    t0, last_save = time.perf_counter(), time.perf_counter()
    head.train()
    done = False
    ema = None
    n_seen = 0
    while not done and epoch_f < cfg.epochs:
        groups = _batches(starts, train_seqs, cfg.batch_tokens, np.random.default_rng(cfg.seed + int(epoch_f * 1000)))
        skip = int(round((epoch_f - int(epoch_f)) * len(groups)))
        for gi in range(skip, len(groups)):
            lr = cfg.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total_steps)))
            for g in opt.param_groups:
                g["lr"] = lr
            batch = _collate(groups[gi], tokens, feats, starts, n_prompt, t2d, label_ids)
            loss, stats = _step_losses(head, batch, cfg.n_steps, cfg.ce_weight, inv_std, cfg.feature_noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            epoch_f = int(epoch_f) + (gi + 1) / len(groups)
            accs = [s_[2] for s_ in stats]
            ema = accs if ema is None else [0.95 * e + 0.05 * a for e, a in zip(ema, accs, strict=False)]
            elapsed = time.perf_counter() - t0
            n_seen += sum(s_[3] for s_ in stats[:1])
            if progress and step % 10 == 0:
                print(f"[train] step {step} epoch {epoch_f:.2f} lr {lr:.2e} loss {loss.item():.3f} "
                      f"top-1 per step {' '.join(f'{a:.3f}' for a in ema)} {n_seen / elapsed:.0f} tok/s "
                      f"{elapsed / 60:.1f} min",
                      file=sys.stderr, flush=True)
            if time.perf_counter() - last_save > 300:
                _save_ckpt(ckpt_path, head, opt, step, epoch_f)
                last_save = time.perf_counter()
            if elapsed > cfg.minutes * 60:
                done = True
                break
        if not done:
            epoch_f = float(round(epoch_f))
    _save_ckpt(ckpt_path, head, opt, step, epoch_f)
    head.eval()
    est = estimate(head, hold, tokens, feats, starts, n_prompt, t2d, label_ids)
    save_head(head, out, {"trained_steps": step, "epochs": round(epoch_f, 3), "train_tokens": n_train_tokens,
                          "data": str(cfg.data), "holdout": est, "draft_vocab_coverage": round(coverage, 4)}
              | ({"init": str(cfg.init)} if cfg.init else {}))
    print(f"[train] held-out top-1 step 1 {est['top1_step1']:.3f}, step 2 {est['top1_step2']:.3f} "
          f"(given step 1 right); wrote {out}", file=sys.stderr)
    return out


def _save_ckpt(path: Path, head: EagleHead, opt, step: int, epoch: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch,
                "head_config": asdict(head.cfg), "d2t": head.d2t.numpy()}, tmp)
    tmp.rename(path)


@torch.no_grad()
def estimate(head: EagleHead, seqs: np.ndarray, tokens, feats, starts, n_prompt, t2d, label_ids=None) -> dict:
    """Held-out top-1 of step 1 and of step 2 where step 1 was right (the chain's first two
    acceptance rates under greedy drafting, teacher-forced context)."""
    n1 = n1_ok = n2 = n2_ok = 0
    for s in seqs:
        batch = _collate([s], tokens, feats, starts, n_prompt, t2d, label_ids)
        tok_in, f_in, pos, valid, labels = batch
        L = tok_in.shape[1]
        p1, p2 = head(tok_in, f_in[:, :L], pos, valid, 2)
        a1 = head.logits(p1).argmax(-1) == labels[:, :L]
        a2 = head.logits(p2).argmax(-1) == labels[:, 1:1 + L]
        m1 = labels[:, :L] >= 0
        m2 = (labels[:, 1:1 + L] >= 0) & a1
        n1 += int(m1.sum())
        n1_ok += int((a1 & m1).sum())
        n2 += int(m2.sum())
        n2_ok += int((a2 & m2).sum())
    return {"top1_step1": n1_ok / max(n1, 1), "top1_step2": n2_ok / max(n2, 1), "tokens": n1}
