"""Self-distillation data for drafter heads: the target's own greedy answers + its features.

The target (with the exact weights the engine runs: int4 dequantized) answers the prompts of
`eagle_prompts` in batches (left-padded `generate`, greedy); the hidden states it computed along
the way (post final norm, what the ONNX graphs output as `hidden`) are kept for every position.
One shard per batch, so an interrupted run resumes at the next batch:
  shard-00012.npz  tokens [N] int32, features [N, H] float16, starts [B+1] int64 (sequence
                   boundaries), n_prompt [B] int64 (prompt tokens of each sequence), and with
                   `aux`: aux [N, 3H] float16, the aux features: the residual stream entering the
                   aux layers (`spec.aux_layers`: low / middle / high) that some drafters read
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DataConfig:
    out: str  # folder for shards + prompts.jsonl
    target: str | None = None  # model source (None: default SmolLM2)
    n_general: int = 900  # general chat prompts
    n_code_chat: int = 500  # programming chat prompts
    n_completion: int = 600  # raw code-completion prompts (stdlib signatures + docstrings)
    n_everyday: int = 0  # first-person everyday chat prompts
    n_self_instruct: int = 0  # user questions the target writes itself (then answers)
    n_tasks: int = 0  # chat prompts from the instruction taxonomy (eagle_prompts.task_prompts)
    max_new_tokens: int = 192  # answer length cap per prompt
    batch: int = 48  # prompts generated together
    max_prompt: int = 384  # longer prompts are skipped
    threads: int | None = None  # torch threads (None: every core this process may use)
    compute: str = "auto"  # the target's matmuls: "bf16" autocast, "fp32", or "auto" (matmul_probe: bf16
    #                        where the CPU's matrix units make it faster); bf16 features differ a little
    #                        from the exact graph's (text_data makes them with the graph itself)
    seed: int = 0  # prompt shuffling
    aux: bool = False  # also keep the aux features (3H per token) for the drafters that read them
    n_wide: int = 0  # prompts of the wide mix (`draft_prompts`: given passages, multi-turn, math steps,
    #                  code in several languages, role play, short and long answers)


def load_target(target: str | None):
    """(model, tokenizer) of the target, the model computing with the weights the default int4 engine
    uses (dequantized)."""
    from edgespec.export.target import sources
    from edgespec.export.target.arch import arch_from_config
    from edgespec.export.target.checks import reference
    from edgespec.export.target.graph.builder import GraphOptions
    from edgespec.export.target.graph.writer import LlamaGraphWriter
    from edgespec.export.target.sources.transformers import hf_weights

    model, tok = sources.load(sources.resolve(target))
    writer = LlamaGraphWriter(arch_from_config(model.config, 2048), hf_weights(model), GraphOptions("int4"))
    return reference.reference_model(model, writer), tok


def encode(tok, row: dict) -> list[int]:
    """The ids the runtime's TextCodec makes of a prompt row (raw text or chat messages)."""
    if "messages" in row:
        text = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False).input_ids
    return tok(row["prompt"]).input_ids


SELF_INSTRUCT = (
    "Write one question that a person might ask a helpful assistant about {t}. Write only the question.",
    "Write a short request someone could send to an AI assistant about {t}. Only the request, nothing else.",
    "Imagine a user who needs help with something related to {t}. What would they type? Reply with their message only.",
)


def _left_padded(ids: list[list[int]], pad: int):
    import torch

    n_p = max(len(x) for x in ids)
    inp = torch.full((len(ids), n_p), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), n_p), dtype=torch.long)
    for r, x in enumerate(ids):
        inp[r, n_p - len(x) :] = torch.tensor(x)
        mask[r, n_p - len(x) :] = 1
    return inp, mask


def self_instruct(model, tok, n: int, batch: int, seed: int, progress: bool = True) -> list[dict]:
    """n chat prompts written by the target itself: asked for a user's question about a topic, it
    answers with one; the first line of each answer that looks like a request is kept."""
    import random

    import torch

    from edgespec.export.train.prompt_mix import TOPICS

    rng = random.Random(seed + 1)
    out: list[dict] = []
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    seen: set[str] = set()
    for _ in range(8):  # rounds; each asks for the prompts still missing (duplicates are dropped)
        if len(out) >= n:
            break
        asks = [rng.choice(SELF_INSTRUCT).format(t=rng.choice(TOPICS)) for _ in range(n - len(out))]
        for i in range(0, len(asks), batch):
            ids = [encode(tok, {"messages": [{"role": "user", "content": a}]}) for a in asks[i : i + batch]]
            inp, mask = _left_padded(ids, pad)
            with torch.inference_mode():  # sampled, for variety; the answers to them are greedy
                g = model.generate(
                    input_ids=inp,
                    attention_mask=mask,
                    max_new_tokens=48,
                    do_sample=True,
                    temperature=0.9,
                    top_p=0.95,
                    pad_token_id=pad,
                )
            for row in g[:, inp.shape[1] :]:
                text = tok.decode(row, skip_special_tokens=True).strip().strip('"').split("\n")[0].strip()
                words = len(text.split())
                if 4 <= words <= 60 and text.lower() not in seen and not text.lower().startswith(("sure", "here")):
                    seen.add(text.lower())
                    out.append({"id": f"self-{len(out)}", "messages": [{"role": "user", "content": text}]})
            if progress:
                print(f"[data] self-instruct: {len(out)}/{n} prompts", file=sys.stderr, flush=True)
    return out[:n]


def generate_data(cfg: DataConfig, progress: bool = True) -> Path:
    import torch

    from edgespec.export.target import spec as es
    from edgespec.export.train.matmul_probe import choose, default_threads

    torch.set_num_threads(cfg.threads or default_threads())
    compute = choose(cfg.compute)
    if progress:
        print(f"[data] {torch.get_num_threads()} threads; {compute.reason}", file=sys.stderr, flush=True)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_target(cfg.target)
    aux_layers = es.aux_layers(model.config.num_hidden_layers)
    rows = _prompt_rows(cfg, out, model, tok, compute, progress)
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    ids = [encode(tok, r) for r in rows]
    order = sorted((i for i in range(len(ids)) if len(ids[i]) <= cfg.max_prompt), key=lambda i: len(ids[i]))
    batches = [order[i : i + cfg.batch] for i in range(0, len(order), cfg.batch)]
    # the ETA weighs each batch by its padded work (prompts grow along the list: sorted by length)
    cost = [len(idx) * (max(len(ids[i]) for i in idx) + cfg.max_new_tokens) for idx in batches]
    todo = [b for b in range(len(batches)) if not (out / f"shard-{b:05d}.npz").exists()]
    meter = GenMeter(sum(cost[b] for b in todo))
    for b, idx in enumerate(batches):
        path = out / f"shard-{b:05d}.npz"
        if path.exists():
            continue
        arrays = _answer_batch(model, cfg, compute, [ids[i] for i in idx], pad, eos, aux_layers)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.rename(path)
        starts, n_prompt = arrays["starts"], arrays["n_prompt"]
        meter.add(int(starts[-1]), int(starts[-1] - n_prompt.sum()), cost[b])
        if progress:
            print(
                f"[data] batch {b + 1}/{len(batches)}: {starts[-1]} tokens, {meter.line()}", file=sys.stderr, flush=True
            )
    if todo:
        log_run(out, compute.dtype, torch.get_num_threads(), meter)
    (out / "done").write_text(f"{len(batches)} batches\n")
    return out


def _prompt_rows(cfg: DataConfig, out: Path, model, tok, compute, progress: bool) -> list[dict]:
    """The prompts the run answers: prompts.jsonl where an earlier run left it (self-instruct ones
    included), else the mix the config asks for, written there first."""
    import random

    from edgespec.export.train.matmul_probe import autocast
    from edgespec.export.train.prompt_mix import build_prompts

    prompts_file = out / "prompts.jsonl"
    if prompts_file.exists():  # a resumed run answers the same prompts (self-instruct ones included)
        rows = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    else:
        rows = build_prompts(cfg.n_general, cfg.n_code_chat, cfg.n_completion, cfg.seed, cfg.n_everyday, cfg.n_tasks)
        if cfg.n_wide:
            from edgespec.export.train.wide_prompts import wide_prompts

            rows += wide_prompts(cfg.n_wide, cfg.seed)
        if cfg.n_self_instruct:
            with autocast(compute):
                rows += self_instruct(model, tok, cfg.n_self_instruct, cfg.batch, cfg.seed, progress)
            random.Random(cfg.seed).shuffle(rows)
        tmp = prompts_file.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(prompts_file)
    return rows


def _answer_batch(model, cfg: DataConfig, compute, prompts: list[list[int]], pad: int, eos: list[int], aux_layers):
    """The target's greedy answers to a batch of tokenized prompts as a shard's arrays: tokens,
    features (the final-norm hidden state of each position), starts, n_prompt and, where cfg.aux, aux
    (the streams entering aux_layers), all but the answers' last token (it has no feature yet)."""
    import torch

    from edgespec.export.train.matmul_probe import autocast

    inp, mask = _left_padded(prompts, pad)
    n_p = inp.shape[1]
    with torch.inference_mode(), autocast(compute):
        g = model.generate(
            input_ids=inp,
            attention_mask=mask,
            max_new_tokens=cfg.max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            output_hidden_states=True,
            return_dict_in_generate=True,
        )
    # features: step 0 holds the prompt positions, every later step one new position
    feats = torch.cat([g.hidden_states[0][-1]] + [h[-1] for h in g.hidden_states[1:]], dim=1)
    # hidden_states[l] is the stream entering layer l (0: the embeddings), the graphs' hidden_aux
    aux = (
        torch.cat([torch.cat([h[l] for l in aux_layers], dim=-1) for h in g.hidden_states], dim=1) if cfg.aux else None
    )  # [B, t, 3H]
    toks, fts, auxs, starts, n_prompt = [], [], [], [0], []
    for r, prompt in enumerate(prompts):
        new = g.sequences[r, n_p:].tolist()
        n_new = next((j + 1 for j, t in enumerate(new) if t in eos), len(new))
        seq = prompt + new[:n_new]
        f = feats[r, n_p - len(prompt) : n_p - len(prompt) + len(seq)]
        seq = seq[: f.shape[0]]  # the last generated token has no feature yet
        toks.append(np.array(seq, np.int32))
        fts.append(f.float().numpy().astype(np.float16))
        if aux is not None:
            auxs.append(aux[r, n_p - len(prompt) : n_p - len(prompt) + len(seq)].float().numpy().astype(np.float16))
        starts.append(starts[-1] + len(seq))
        n_prompt.append(len(prompt))
    arrays = {
        "tokens": np.concatenate(toks),
        "features": np.concatenate(fts),
        "starts": np.array(starts, np.int64),
        "n_prompt": np.array(n_prompt, np.int64),
    }
    return arrays | ({"aux": np.concatenate(auxs)} if auxs else {})


class GenMeter:
    """Tokens per second and the time left of a data run (the ETA: the work left, each batch's
    padded size, at this run's pace)."""

    def __init__(self, work: int) -> None:
        self.work = work  # padded tokens of the batches this run makes
        self.done = 0  # of them made so far
        self.tokens = 0  # sequence tokens written (prompt + answer)
        self.new = 0  # answer tokens the target generated
        self.t0 = time.perf_counter()

    def add(self, tokens: int, new: int, work: int) -> None:
        self.tokens, self.new, self.done = self.tokens + tokens, self.new + new, self.done + work

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def eta_s(self) -> float:
        return self.elapsed() * max(0, self.work - self.done) / max(self.done, 1)

    def line(self) -> str:
        dt = max(self.elapsed(), 1e-9)
        gen = f" ({self.new / dt:.0f} generated/s)" if self.new else ""
        return f"{self.tokens / dt:.0f} tok/s{gen}, {dt / 60:.1f} min, ETA {self.eta_s() / 60:.1f} min"


def log_run(out: Path, compute: str, threads: int, meter: GenMeter) -> None:
    """Append this run's compute dtype, threads and pace to out/generation.json (a resumed folder
    may hold shards made differently)."""
    path = out / "generation.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    dt = max(meter.elapsed(), 1e-9)
    runs.append(
        {
            "compute": compute,
            "threads": threads,
            "tokens": meter.tokens,
            "tokens_per_s": round(meter.tokens / dt, 1),
            "generated_per_s": round(meter.new / dt, 1),
            "seconds": round(dt, 1),
        }
    )
    path.write_text(json.dumps(runs, indent=1) + "\n")


def load_shards(folder: str | Path):
    """(tokens [N] int32, features [N, H] float16, starts [S+1], n_prompt [S]) over all shards of
    one folder, or of several given as "DIR1,DIR2"."""
    toks, fts, starts, n_prompt, base = [], [], [0], [], 0
    shards = [p for f in str(folder).split(",") for p in sorted(Path(f).glob("shard-*.npz"))]
    for p in shards:
        if ".tmp" in p.name:
            continue
        z = np.load(p)
        toks.append(z["tokens"])
        fts.append(z["features"])
        starts.extend((z["starts"][1:] + base).tolist())
        n_prompt.extend(z["n_prompt"].tolist())
        base += int(z["starts"][-1])
    if not toks:
        raise FileNotFoundError(f"no shard-*.npz in {folder}; generate data first (edgespec train-eagle makes it)")
    return np.concatenate(toks), np.concatenate(fts), np.array(starts, np.int64), np.array(n_prompt, np.int64)


def load_aux(folder: str | Path) -> np.ndarray:
    """aux [N, 3H] float16 over the same shards, in the same order, as `load_shards` (data made with
    `DataConfig.aux`): the aux features some drafters read."""
    shards = [p for f in str(folder).split(",") for p in sorted(Path(f).glob("shard-*.npz")) if ".tmp" not in p.name]
    parts = []
    for p in shards:
        z = np.load(p)
        if "aux" not in z:
            raise FileNotFoundError(
                f"{p} has no aux features; make the data with aux=True (the training commands "
                "of the drafters that read them do)"
            )
        parts.append(z["aux"])
    if not parts:
        raise FileNotFoundError(f"no shard-*.npz in {folder}")
    return np.concatenate(parts)


def load_soft(folder: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(top-k ids [N, k] int32, probs [N, k] float32, has [N] bool) over the same shards, in the
    same order, as `load_shards`: the target's next-token distribution at each position where a
    shard holds one (teacher-forced text data, `text_data`), has False (zeros) elsewhere; None
    when no shard holds any."""
    shards = [p for f in str(folder).split(",") for p in sorted(Path(f).glob("shard-*.npz")) if ".tmp" not in p.name]
    parts = []
    for p in shards:
        z = np.load(p)
        parts.append((z["topk_ids"], z["topk_probs"]) if "topk_ids" in z else len(z["tokens"]))
    soft = [x for x in parts if not isinstance(x, int)]
    if not soft:
        return None
    k = soft[0][0].shape[1]
    ids, probs, has = [], [], []
    for x in parts:
        if isinstance(x, int):
            ids.append(np.zeros((x, k), np.int32))
            probs.append(np.zeros((x, k), np.float32))
            has.append(np.zeros(x, bool))
        else:
            if x[0].shape[1] != k:
                raise ValueError(f"{folder}: shards keep different numbers of soft labels ({k}, {x[0].shape[1]})")
            ids.append(x[0])
            probs.append(x[1].astype(np.float32))
            has.append(np.ones(len(x[0]), bool))
    return np.concatenate(ids), np.concatenate(probs), np.concatenate(has)
