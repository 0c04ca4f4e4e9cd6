"""`edgespec export`: target (+ draft) -> engine folder of static-shape ONNX graphs + manifest.json.

The folder is built under a temporary name next to the destination and renamed at the very end,
so an interrupted or failed export never leaves a folder that loads.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from edgespec.engines import manifest as mf
from edgespec.export import sources
from edgespec.export.arch import ArchSpec, arch_from_config
from edgespec.export.graph import GraphOptions, LlamaGraphWriter, one_row_int4_differs
from edgespec.export.weights import write_weights

from edgespec import __version__

PRECISIONS = ("fp32", "fp16", "int4")
# max |ORT - PyTorch| logits allowed per precision (PyTorch runs the weights the graph really uses)
TOLERANCE = {"fp32": 2e-3, "fp16": 0.25, "int4": 2e-3}
INT8_ACTIVATION_TOLERANCE = 3.0  # int4 with accuracy_level >= 2 quantizes activations too
SHIPPED_HEADS = Path(__file__).parent / "heads"  # trained EAGLE heads shipped for default models
# draft tokens an exported EAGLE head keeps when its d2t is in frequency order: the head re-reads its
# weights after every target call (they leave the cache) and its draft-vocabulary LM-head rows were
# half of them; 4096 of 8192 cover 94.7% of the training answers (README, stop 14)
EAGLE_DRAFT_VOCAB = 4096


def _tolerance(opts: GraphOptions) -> float:
    if opts.precision == "int4" and opts.int4_accuracy_level >= 2:
        return INT8_ACTIVATION_TOLERANCE  # activations quantized to int8: lossy against PyTorch by design
    return TOLERANCE[opts.precision]


class ExportError(ValueError):
    """Bad export arguments or a failed export step (the message says which and what to do)."""


@dataclass(frozen=True)
class ExportConfig:
    target: str | None = None  # model source: HF folder, .gguf, hub id; None = default SmolLM2
    draft: str | None = None  # None, another model source, "self:N" (first N layers) or "self:int4"
    eagle: str | None = "auto"  # EAGLE head folder; "auto": the shipped head when the target is the
    #                             default model, else none; None / "none": no head
    eagle_draft_vocab: int | None = None  # the head keeps its N most frequent draft tokens (None:
    #                                        EAGLE_DRAFT_VOCAB when the head records that order; 0: all)
    medusa: str | None = "auto"  # Medusa heads folder; "auto": the shipped heads when the target is the
    #                              default model, else none; None / "none": no heads
    out: str | None = None  # engine folder; None = engines/<target name>
    max_len: int = 2048  # KV slots (prompt + output)
    k: int = 8  # largest num_speculative_tokens: verify graphs for widths 2..k+1 are exported
    precision: str = "int4"  # target weights: int4 (MatMulNBits, the CPU default) | fp32 | fp16
    prefill_chunk: int = 64  # prompt tokens per prefill call (width of the prefill graph)
    kv_bucket: int = 64  # attention reads the cache in multiples of this many slots
    int4_accuracy_level: int = 4  # MatMulNBits accuracy_level: 4 = int8 activations (fast), 0 = fp32
    int4_lm_head: bool = False  # int4 LM head too: ~20% faster decode, visibly worse text on small models
    int8_lm_head: bool = True  # int4 precision: 8-bit LM head (Q8_0 scheme, int8 activations); False: fp32
    trees: bool = True  # token-tree verify (tree_mask input) in the target and EAGLE head graphs (no
    #                     measurable decode cost, README); False: chain-only graphs
    eagle3_features: bool = False  # target graphs also output hidden_aux: the residual stream entering
    #                                layers 2, L//2 and L-3, concatenated [1, T, 3H] (EAGLE-3 fusion)
    two_row_matmuls: str = "auto"  # int4: 1-token calls run the int4 matmuls on 2 rows so decode rows equal
    #                                verify rows bitwise; "auto": when this CPU's ORT needs it (probed), "on", "off"
    force: bool = False  # replace an existing folder
    validate: bool = True  # compare every graph with PyTorch after export
    progress: bool = True  # show a progress bar

    def check(self) -> None:
        if self.k < 1:
            raise ExportError(f"--k must be >= 1 (got {self.k})")
        if self.eagle_draft_vocab is not None and self.eagle_draft_vocab < 0:
            raise ExportError(f"--eagle-draft-vocab must be >= 0 (got {self.eagle_draft_vocab}; 0 keeps them all)")
        if self.two_row_matmuls not in ("auto", "on", "off"):
            raise ExportError(f"--two-row-matmuls {self.two_row_matmuls!r}: choose auto, on or off")
        if self.precision not in PRECISIONS:
            raise ExportError(f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.prefill_chunk < 1 or self.kv_bucket < 1:
            raise ExportError("--prefill-chunk and --kv-bucket must be >= 1")
        if self.max_len < self.prefill_chunk:
            raise ExportError(f"--max-len {self.max_len} is smaller than the prefill chunk "
                              f"{self.prefill_chunk}; raise --max-len or lower --prefill-chunk")
        if self.kv_bucket % 16:
            raise ExportError(f"--kv-bucket {self.kv_bucket} must be a multiple of 16 (attention reductions "
                              "then keep one SIMD layout across phase widths: bitwise parity)")
        if self.max_len % self.kv_bucket:
            raise ExportError(f"--max-len {self.max_len} must be a multiple of --kv-bucket {self.kv_bucket}")
        if self.max_len < self.k + 2:
            raise ExportError(f"--max-len {self.max_len} leaves no room for k={self.k}")


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="export", unit="step", file=sys.stderr)

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(what)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def eagle3_layers(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / middle / high feature layers (as SGLang and vLLM pick them): the residual
    stream entering layers 2, n//2 and n-3 (clamped for very shallow models)."""
    return tuple(sorted({min(2, n_layers - 1), n_layers // 2, max(n_layers - 3, 0)}))


def _hf_weights(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _phase(width: int, chunk: int) -> str:
    return "prefill" if width == chunk else ("decode" if width == 1 else "verify")


def _write_model(writer: LlamaGraphWriter, folder: Path, prefix: str, widths: list[int], chunk: int,
                 weights_file: str, index: dict, kind: str, progress: _Progress) -> dict:
    """Write the phase graphs of one model; return its manifest entry."""
    import onnx

    offsets = {name: e["offset"] for name, e in index.items()}
    graphs, used = [], set()
    kv_dtype = writer.dtype.name
    model = writer.build(weights_file, offsets)
    fname = f"{prefix}.onnx"
    onnx.save(model, folder / fname)
    used.update(i.name for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL)
    progress.step(f"graph {fname}")
    for w in widths:  # the phases: static widths the one graph is fed at
        graphs.append({
            "phase": _phase(w, chunk), "width": w, "file": fname,
            "inputs": [{"name": "input_ids", "shape": [1, w], "dtype": "int64"},
                       {"name": "positions", "shape": [1, w], "dtype": "int64"},
                       {"name": "past_len", "shape": [1], "dtype": "int64"}]
            + ([{"name": "tree_mask", "shape": [w, w], "dtype": "int64"}] if writer.opts.trees else [])
            + [{"name": f"past_{kind_}_{i}", "shape": ["S", writer.arch.n_kv_heads * writer.arch.head_dim],
                "dtype": kv_dtype} for i in range(writer.n_layers) for kind_ in ("key", "value")],
            "outputs": [{"name": "logits", "shape": [1, w, writer.arch.vocab_size], "dtype": "float32"},
                        {"name": "new_kv", "shape": [writer.n_layers, 2, w,
                                                     writer.arch.n_kv_heads * writer.arch.head_dim],
                         "dtype": kv_dtype},
                        {"name": "hidden", "shape": [1, w, writer.arch.hidden_size], "dtype": kv_dtype}]
            + ([{"name": "hidden_aux", "shape": [1, w, len(writer.opts.aux_layers) * writer.arch.hidden_size],
                 "dtype": kv_dtype}] if writer.opts.aux_layers else [])})
    arch = writer.arch.to_manifest() | {"n_layers": writer.n_layers}
    if writer.opts.aux_layers:
        arch["aux_layers"] = list(writer.opts.aux_layers)
    return {"kind": kind, "precision": writer.opts.precision, "architecture": arch, "kv_dtype": kv_dtype,
            "window": "S >= past_len + T",  # the past_key/past_value window covers the new rows
            "weights": {"file": weights_file, "tensors": {k: v for k, v in index.items() if k in used}},
            "graphs": graphs}


def _reference_model(model, writer: LlamaGraphWriter):
    """The PyTorch model computing with exactly the weights the graphs use (int4: dequantized)."""
    import torch

    ref = copy.deepcopy(model)
    with torch.no_grad():
        params = dict(ref.named_parameters(remove_duplicate=False))
        for name, arr in writer.reference.items():
            if name == "lm_head.weight":  # untie: the graph's embedding Gather stays unquantized
                ref.lm_head.weight = torch.nn.Parameter(torch.from_numpy(arr.copy()))
            elif name in params:
                params[name].copy_(torch.from_numpy(arr))
        if writer.n_layers < ref.config.num_hidden_layers:
            ref.model.layers = ref.model.layers[: writer.n_layers]
            ref.config.num_hidden_layers = writer.n_layers
    return ref.eval()


def _validate(folder: Path, role: str, ref_model, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """ORT (through the runtime's engine) vs PyTorch logits, per graph, on one token sequence.

    The sequence is fed as the runtime would: one prefill chunk, then every other width in turn,
    so each graph runs at a nonzero past_len over a bucketed cache.
    """
    import torch
    from edgespec.engines.ort import OrtModel

    man = mf.load_manifest(folder)
    spec = man.target if role == "target" else man.draft
    engine = OrtModel(man, spec)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(tokens[None])).logits[0].float().numpy()  # [N, V]
    order = [man.prefill_chunk] + [w for w in spec.widths() if w != man.prefill_chunk]
    diffs, past = {}, 0
    for w in order:
        if past + w > len(tokens):
            break
        got = engine.forward(tokens[past:past + w], past)
        diffs[f"{spec.graph_for(w).phase}_t{w}"] = float(np.abs(got - ref[past:past + w]).max())
        engine.commit(past, w)
        past += w
    worst = max(diffs, key=diffs.get)
    if diffs[worst] > tol:
        raise ExportError(f"{role} graph at {worst}: max |ORT - PyTorch| logits = {diffs[worst]:.3g} > "
                          f"tolerance {tol:g} (all: {diffs}). The export is not trustworthy; "
                          "please report it with the model config.")
    return diffs


def _validation_tokens(tok, n: int, vocab: int) -> np.ndarray:
    text = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
            "        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
            "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens cheaply "
            "and verifies them in one pass of the target model. ") * 8
    ids = [i for i in tok(text)["input_ids"] if i < vocab]
    if len(ids) < n:  # tiny test vocabularies: fill with a deterministic pattern
        ids = list(np.random.default_rng(0).integers(0, vocab, n))
    return np.array(ids[:n], np.int64)


def _check_same_tokenizer(tok_t, tok_d, vocab_t: int, vocab_d: int) -> None:
    if vocab_t != vocab_d:
        raise ExportError(f"draft vocab size {vocab_d} != target vocab size {vocab_t}: a draft must share "
                          "the target's tokenizer. Hint: pick a draft from the same model family.")
    vt, vd = tok_t.get_vocab(), tok_d.get_vocab()
    if vt != vd:
        n_diff = sum(1 for k, v in vt.items() if vd.get(k) != v)
        raise ExportError(f"draft tokenizer differs from the target's in {n_diff} of {len(vt)} entries; "
                          "a draft must share the target's tokenizer.")


def _eos_ids(model, tok) -> list[int]:
    ids = set()
    for src in (getattr(model, "generation_config", None), model.config, tok):
        e = getattr(src, "eos_token_id", None)
        ids.update([e] if isinstance(e, int) else (e or []))
    return sorted(i for i in ids if i is not None)


def export(cfg: ExportConfig) -> Path:
    """Run the whole export; returns the finished folder."""
    cfg.check()
    t0 = time.perf_counter()
    src = sources.resolve(cfg.target)
    out = Path(cfg.out) if cfg.out else Path("engines") / src.name
    if out.exists() and not cfg.force:
        raise ExportError(f"{out} already exists; pass --force to replace it (or choose another --out)")
    widths_t = sorted(set(range(1, cfg.k + 2)) | {cfg.prefill_chunk})
    widths_d = sorted({1, cfg.prefill_chunk})
    has_draft = cfg.draft is not None
    head_dir = _heads_dir(cfg.eagle, src, "", "eagle")
    medusa_dir = _heads_dir(cfg.medusa, src, "-medusa", "medusa")
    n_steps = 6 + (3 if has_draft else 0) + (3 if head_dir else 0) + (2 if medusa_dir else 0)
    progress = _Progress(n_steps, cfg.progress)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        model, tok = sources.load(src)
        progress.step(f"loaded {src.name}")
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos and cfg.max_len > max_pos:
            raise ExportError(f"--max-len {cfg.max_len} exceeds the model's max_position_embeddings {max_pos}")
        arch = arch_from_config(model.config, cfg.max_len)
        two_rows = cfg.precision == "int4" and (cfg.two_row_matmuls == "on" or cfg.two_row_matmuls == "auto" and
                                                one_row_int4_differs(accuracy_level=cfg.int4_accuracy_level))
        opts = GraphOptions(cfg.precision, int4_accuracy_level=cfg.int4_accuracy_level,
                            int4_lm_head=cfg.int4_lm_head, int8_lm_head=cfg.int8_lm_head, trees=cfg.trees,
                            aux_layers=eagle3_layers(arch.n_layers) if cfg.eagle3_features else (),
                            two_row_matmuls=two_rows)
        hf_w = _hf_weights(model)
        writer = LlamaGraphWriter(arch, hf_w, opts)
        index_t = write_weights(writer.store.arrays, tmp / "target.weights")
        progress.step("wrote target.weights")
        models = {"target": _write_model(writer, tmp, "target", widths_t, cfg.prefill_chunk,
                                         "target.weights", index_t, "target", progress)}
        tok_dir = tmp / ".tok"
        tok.save_pretrained(tok_dir)
        shutil.copy(tok_dir / "tokenizer.json", tmp / "tokenizer.json")
        chat = getattr(tok, "chat_template", None)
        if chat:
            (tmp / "chat_template.jinja").write_text(chat)
        shutil.rmtree(tok_dir)
        progress.step("tokenizer")

        draft_writer = draft_model = None
        if has_draft:
            draft_writer, draft_model, draft_kind = _draft_writer(cfg, arch, hf_w, model, tok, dataclasses.replace(
                opts, trees=False, aux_layers=()))  # a draft model drafts chains
            if draft_writer.opts.precision == cfg.precision and draft_model is model:
                weights_d, index_d = "target.weights", index_t  # self:N shares the target's weights
            else:
                weights_d = "draft.weights"
                index_d = write_weights(draft_writer.store.arrays, tmp / weights_d)
            progress.step("draft weights")
            models["draft"] = _write_model(draft_writer, tmp, "draft", widths_d, cfg.prefill_chunk,
                                           weights_d, index_d, draft_kind, progress)
        eagle_writer = None
        if head_dir is not None:
            eagle_writer, models["eagle"] = _write_eagle(head_dir, tmp, arch, writer, index_t, opts,
                                                         sorted(set(range(1, cfg.k + 2)) | {cfg.prefill_chunk}),
                                                         cfg.prefill_chunk, cfg.eagle_draft_vocab)
            progress.step("EAGLE head")
            models["eagle_fused"] = _write_eagle_fused(tmp, models["target"], models["eagle"])
            progress.step("target+EAGLE graph")
        medusa_writer = None
        if medusa_dir is not None:
            medusa_writer, models["medusa"] = _write_medusa(medusa_dir, tmp, arch, writer, opts)
            progress.step("Medusa heads")
        manifest = {
            "format": mf.FORMAT, "version": mf.VERSION, "edgespec_version": __version__,
            "name": out.name, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "source": {"kind": src.kind, "path": src.path, "sha256": sources.sha256_of(src.path)
                       if src.kind != "hub" else None, "draft": cfg.draft},
            "max_len": cfg.max_len, "kv_bucket": cfg.kv_bucket, "prefill_chunk": cfg.prefill_chunk,
            "num_speculative_tokens": cfg.k,
            "two_row_matmuls": two_rows,  # 1-token calls ran the int4 matmuls on 2 rows (decode = verify bitwise)
            "tokenizer": {"file": "tokenizer.json", "chat_template_file": "chat_template.jinja" if chat else None,
                          "eos_token_ids": _eos_ids(model, tok), "bos_token_id": tok.bos_token_id},
            "models": models,
            "drafters": ["none", "ngram"] + (["draft"] if has_draft else [])
            + (["eagle", "hybrid"] if head_dir else []) + (["medusa"] if medusa_dir else []),
            # measured on this CPU (README): adaptive prompt lookup beat every fixed k
            "defaults": {"drafter": "ngram", "k": cfg.k, "adaptive": True},
        }
        (tmp / mf.MANIFEST).write_text(json.dumps(manifest, indent=1))
        if cfg.validate:
            n_val = cfg.prefill_chunk + sum(w for w in widths_t if w != cfg.prefill_chunk)
            tokens = _validation_tokens(tok, n_val, arch.vocab_size)
            report = {"target": _validate(tmp, "target", _reference_model(model, writer), tokens,
                                          _tolerance(writer.opts))}
            progress.step("validated target")
            if eagle_writer is not None:
                report["eagle"] = _validate_eagle(tmp, eagle_writer, _reference_model(model, writer), tokens)
                report["eagle_fused"] = _validate_fused(tmp, tokens, _tolerance(eagle_writer.opts))
                if report["eagle_fused"] is None:  # not bitwise the plain target: leave it out
                    del manifest["models"]["eagle_fused"], report["eagle_fused"]
                    (tmp / "target_eagle.onnx").unlink()
                progress.step("validated EAGLE head")
            if medusa_writer is not None:
                report["medusa"] = _validate_medusa(tmp, medusa_writer, _reference_model(model, writer), tokens)
                progress.step("validated Medusa heads")
            if has_draft:
                report["draft"] = _validate(tmp, "draft", _reference_model(draft_model, draft_writer), tokens,
                                            _tolerance(draft_writer.opts))
            for role, diffs in report.items():
                manifest["models"][role]["validation"] = diffs
            (tmp / mf.MANIFEST).write_text(json.dumps(manifest, indent=1))
        progress.step("validated")
        progress.close()
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # the only step that makes the folder loadable
    except BaseException:
        progress.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"edgespec: exported {out} ({size:.0f} MiB) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for role, spec in manifest["models"].items():
        if spec.get("validation"):
            worst = max(spec["validation"].values())
            what = "head logits vs the head's own graph" if role == "eagle_fused" else "|ORT - PyTorch| logits"
            print(f"  {role}: max {what} over {len(spec['validation'])} phase widths = {worst:.2e}", file=sys.stderr)
    return out


def _heads_dir(arg: str | None, src, suffix: str, kind: str) -> Path | None:
    """The drafting-head folder an --eagle / --medusa argument names: none, the shipped one for the
    default model (heads/<name><suffix>), or a folder."""
    if arg in (None, "none", ""):
        return None
    if arg == "auto":
        shipped = SHIPPED_HEADS / (src.name + suffix)
        return shipped if src.kind == "default" and (shipped / "config.json").exists() else None
    path = Path(arg)
    if not path.is_dir():
        raise ExportError(f"--{kind} {arg}: not a folder. Hint: train one with `edgespec train-{kind} "
                          f"--out {arg}` or pass --{kind} none")
    return path


def _write_medusa(heads_dir: Path, folder: Path, arch: ArchSpec, writer: LlamaGraphWriter, opts: GraphOptions):
    """medusa.weights + medusa.onnx; manifest entry."""
    import onnx
    from edgespec.export.medusa import MedusaFormatError, read_heads
    from edgespec.export.medusa_graph import MedusaGraphWriter

    try:
        mc, arrays = read_heads(heads_dir, arch.hidden_size, arch.vocab_size)
    except MedusaFormatError as e:
        raise ExportError(str(e)) from e
    mw = MedusaGraphWriter(arch, mc, arrays, writer.reference["lm_head.weight"], opts)
    index = write_weights(mw.store.arrays | {"d2t": mw.d2t}, folder / "medusa.weights")
    model = mw.build("medusa.weights", {k: v["offset"] for k, v in index.items()})
    onnx.save(model, folder / "medusa.onnx")
    used = {i.name for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
    meta = json.loads((heads_dir / "config.json").read_text()).get("medusa", {})
    entry = {"kind": "medusa", "precision": mw.opts.precision,
             "architecture": {"n_heads": mc.n_heads, "n_layers": mc.n_layers, "hidden_size": mc.hidden_size,
                              "vocab_size": mc.draft_vocab_size},
             "graph": {"file": "medusa.onnx",
                       "inputs": [{"name": "features", "shape": [1, mc.hidden_size], "dtype": mw.dtype.name}],
                       "outputs": [{"name": "logits", "shape": [mc.n_heads, mc.draft_vocab_size],
                                    "dtype": "float32"}]},
             "weights": {"file": "medusa.weights", "tensors": {k: v for k, v in index.items() if k in used}},
             "d2t": index["d2t"] | {"file": "medusa.weights"},
             "heads": {"source": str(heads_dir), "target_vocab_size": arch.vocab_size, "trained": meta}}
    return mw, entry


def _validate_medusa(folder: Path, mw, ref_target, tokens: np.ndarray) -> dict[str, float]:
    """ORT heads vs the PyTorch heads (same dequantized weights) on the target's real features."""
    import torch
    from edgespec.engines.ort import OrtHeads
    from edgespec.export.medusa import build_heads

    man = mf.load_manifest(folder)
    engine = OrtHeads(man, man.medusa)
    with torch.no_grad():
        feats = ref_target.model(torch.from_numpy(tokens[None])).last_hidden_state[0].float().numpy()  # [N, H]
    K = mw.mc.n_heads
    arrays = dict(mw.reference) | {"d2t": mw.d2t}
    b0 = mw.store.arrays["blocks0_b"].astype(np.float32).reshape(K, -1)
    for i in range(K):
        arrays[f"{i}.0.linear.bias"] = b0[i]
        for j in range(1, mw.mc.n_layers):
            arrays[f"{i}.{j}.linear.bias"] = mw.store.arrays[f"blocks{j}_b"][i, 0].astype(np.float32)
    heads = build_heads(mw.mc, arrays, np.zeros((mw.mc.vocab_size, mw.mc.hidden_size), np.float32))
    heads.lm_head = torch.from_numpy(mw.reference["lm_head_d"])  # the rows the graph uses (int4: dequantized)
    rows = np.linspace(0, len(feats) - 1, 8).astype(int)
    with torch.no_grad():
        ref = heads.logits(heads(torch.from_numpy(feats[rows]))).numpy()  # [8, K, Vd]
    worst = max(float(np.abs(engine.forward(feats[r]) - ref[i]).max()) for i, r in enumerate(rows))
    tol = _tolerance(mw.opts)
    if worst > tol:
        raise ExportError(f"Medusa heads graph: max |ORT - PyTorch| logits = {worst:.3g} > tolerance {tol:g}. "
                          "Please report it with the heads' config.json.")
    return {"heads": worst}


def _write_eagle(head_dir: Path, folder: Path, arch: ArchSpec, writer: LlamaGraphWriter, index_t: dict,
                 opts: GraphOptions, widths: list[int], chunk: int, draft_vocab: int | None):
    """eagle.weights + eagle.onnx (the head reads the target's embedding in place); manifest entry."""
    import onnx
    from edgespec.export.eagle import HeadFormatError, prune_draft_vocab, read_head
    from edgespec.export.eagle_graph import EagleGraphWriter

    try:
        hc, arrays = read_head(head_dir, arch.hidden_size, arch.vocab_size)
        trained_vocab = hc.draft_vocab_size
        if draft_vocab is None:
            draft_vocab = EAGLE_DRAFT_VOCAB if hc.d2t_by_frequency else 0
        hc, arrays = prune_draft_vocab(hc, arrays, draft_vocab)
    except HeadFormatError as e:
        raise ExportError(str(e)) from e
    ew = EagleGraphWriter(arch, hc, arrays, writer.reference["lm_head.weight"], opts)
    index_e = write_weights(ew.store.arrays | {"d2t": ew.d2t}, folder / "eagle.weights")
    embed = writer.store.arrays["embed"]
    model = ew.build("eagle.weights", {k: v["offset"] for k, v in index_e.items()},
                     embed=("target.weights", index_t["embed"]["offset"], embed))
    onnx.save(model, folder / "eagle.onnx")
    kv_dtype = ew.dtype.name
    kv_w = ew.arch.n_kv_heads * ew.arch.head_dim
    used = {i.name for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
    tensors = {k: v for k, v in index_e.items() if k in used} | {"embed": index_t["embed"] | {"file": "target.weights"}}
    graphs = [{"phase": _phase(w, chunk), "width": w, "file": "eagle.onnx",
               "inputs": [{"name": "input_ids", "shape": [1, w], "dtype": "int64"},
                          {"name": "positions", "shape": [1, w], "dtype": "int64"},
                          {"name": "past_len", "shape": [1], "dtype": "int64"}]
               + ([{"name": "tree_mask", "shape": [w, w], "dtype": "int64"}] if opts.trees else [])
               + [{"name": "features", "shape": [1, w, arch.hidden_size], "dtype": kv_dtype},
                          {"name": "past_key_0", "shape": ["S", kv_w], "dtype": kv_dtype},
                          {"name": "past_value_0", "shape": ["S", kv_w], "dtype": kv_dtype}],
               "outputs": [{"name": "logits", "shape": [1, w, hc.draft_vocab_size], "dtype": "float32"},
                           {"name": "new_kv", "shape": [1, 2, w, kv_w], "dtype": kv_dtype},
                           {"name": "hidden", "shape": [1, w, arch.hidden_size], "dtype": kv_dtype}]}
              for w in widths]
    head_meta = json.loads((head_dir / "config.json").read_text()).get("eagle", {})
    entry = {"kind": "eagle", "precision": ew.opts.precision,
             "architecture": ew.arch.to_manifest() | {"n_layers": 1, "vocab_size": hc.draft_vocab_size},
             "kv_dtype": kv_dtype, "window": "S >= past_len + T",
             "weights": {"file": "eagle.weights", "tensors": tensors},
             "d2t": index_e["d2t"] | {"file": "eagle.weights"},
             "head": {"source": str(head_dir), "draft_vocab_size": hc.draft_vocab_size,
                      "trained_draft_vocab_size": trained_vocab,
                      "target_vocab_size": arch.vocab_size, "trained": head_meta},
             "graphs": graphs}
    return ew, entry


def _write_eagle_fused(folder: Path, target: dict, eagle: dict) -> dict:
    """target_eagle.onnx: the target graph with the head appended (eagle_graph.fuse_with_target),
    on the same weights files; its manifest entry (the target's, plus the head's inputs, outputs
    and weights under FUSED_PREFIX)."""
    import onnx
    from edgespec.export.eagle_graph import fuse_with_target

    p = mf.FUSED_PREFIX
    fused = fuse_with_target(onnx.load(folder / "target.onnx", load_external_data=False),
                             onnx.load(folder / "eagle.onnx", load_external_data=False))
    onnx.save(fused, folder / "target_eagle.onnx")
    tensors = target["weights"]["tensors"] | {
        p + k: {"file": eagle["weights"]["file"]} | v for k, v in eagle["weights"]["tensors"].items()}
    graphs = []
    for tg, hg in zip(target["graphs"], eagle["graphs"], strict=True):
        assert tg["width"] == hg["width"], "the head is exported at the target's widths"
        w = tg["width"]
        inputs = tg["inputs"] + [{"name": p + "input_ids", "shape": [1, w], "dtype": "int64"},
                                 {"name": p + "n_given", "shape": [1], "dtype": "int64"}]
        inputs += [t | {"name": p + t["name"]} for t in hg["inputs"] if t["name"].startswith("past_")]
        graphs.append(tg | {"file": "target_eagle.onnx", "inputs": inputs,
                            "outputs": tg["outputs"] + [t | {"name": p + t["name"]} for t in hg["outputs"]]})
    return target | {"kind": "target+eagle", "weights": {"file": target["weights"]["file"], "tensors": tensors},
                     "graphs": graphs}


def _validate_fused(folder: Path, tokens: np.ndarray, head_tol: float) -> dict[str, float] | None:
    """The fused graph against the plain target and the standalone head, call by call at every
    width: its target logits must be BITWISE the plain graph's (greedy eagle output = plain output
    rests on it), its head logits close to the head's own graph. None (with a warning) if the
    target part differs: the folder then runs EAGLE with separate head calls."""
    from edgespec.engines.ort import OrtModel

    man = mf.load_manifest(folder)
    plain, head = OrtModel(man, man.target), OrtModel(man, man.eagle)
    fused = OrtModel(man, man.eagle_fused, head=OrtModel(man, man.eagle))
    order = [man.prefill_chunk] + [w for w in man.target.widths() if w != man.prefill_chunk]
    diffs, past = {}, 0
    for w in order:
        ids, nxt = tokens[past:past + w], tokens[past + 1:past + w + 1]
        if len(ids) < w:
            break
        n = len(nxt)  # rows whose next token is known (the very last row's is not)
        want = plain.forward(ids, past).copy()
        got = fused.forward(ids, past, head_next=nxt)
        name = f"{man.target.graph_for(w).phase}_t{w}"
        if not np.array_equal(got, want):
            print(f"edgespec: warning: the fused target+EAGLE graph's logits at {name} differ from the plain "
                  f"target's by {np.abs(got - want).max():.3g}; left out (eagle uses separate head calls)",
                  file=sys.stderr)
            return None
        head_want = head.forward(nxt, past, features=plain.last_hidden(n))
        diffs[f"head_{name}"] = float(np.abs(fused.last_head_logits(n) - head_want).max())
        if n < w:
            break
        for e in (plain, head, fused):
            e.commit(past, w)
        past += w
    worst = max(diffs, key=diffs.get)
    if diffs[worst] > head_tol:
        raise ExportError(f"fused target+EAGLE graph at {worst}: head logits differ from the head's own graph "
                          f"by {diffs[worst]:.3g} > {head_tol:g} (all: {diffs}). Please report it.")
    return diffs


def _validate_eagle(folder: Path, ew, ref_target, tokens: np.ndarray) -> dict[str, float]:
    """ORT head vs the PyTorch head (same dequantized weights) on the target's real features."""
    import torch
    from edgespec.engines.ort import OrtModel
    from edgespec.export.eagle import build_head

    man = mf.load_manifest(folder)
    engine = OrtModel(man, man.eagle)
    with torch.no_grad():
        feats = ref_target.model(torch.from_numpy(tokens[None])).last_hidden_state[0].float().numpy()  # [N, H]
    ref_arrays = dict(ew.reference) | {"fc.bias": ew.store.arrays["fc_b"].astype(np.float32),
                                                           "d2t": ew.d2t,
                                                           "layers.0.post_attention_layernorm.weight":
                                                               ew.store.arrays["l0.ln2"].astype(np.float32)}
    if ew.head_cfg.input_layernorm:
        ref_arrays["layers.0.input_layernorm.weight"] = ew.store.arrays["l0.ln1"].astype(np.float32)
    if ew.head_cfg.final_norm:
        ref_arrays["norm.weight"] = ew.store.arrays["final_norm"].astype(np.float32)
    cos, sin = ew.arch.rope_tables()
    embed = ref_target.model.embed_tokens.weight.detach().float().numpy()
    head = build_head(ew.head_cfg, ref_arrays, embed, np.zeros_like(embed), cos, sin)
    head.lm_head = torch.from_numpy(ew.reference["lm_head_d"])  # the rows the graph uses (int4: dequantized)
    n = len(tokens) - 1
    with torch.no_grad():
        pred = head(torch.from_numpy(tokens[1:][None]), torch.from_numpy(feats[:n][None]),
                    torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool), n_steps=1)[0]
        ref = head.logits(pred)[0].numpy()  # [n, Vd]
    order = [man.prefill_chunk] + [w for w in man.eagle.widths() if w != man.prefill_chunk]
    diffs, past = {}, 0
    for w in order:
        if past + w > n:
            break
        got = engine.forward(tokens[1 + past:1 + past + w], past, features=feats[past:past + w])
        diffs[f"{man.eagle.graph_for(w).phase}_t{w}"] = float(np.abs(got - ref[past:past + w]).max())
        engine.commit(past, w)
        past += w
    worst = max(diffs, key=diffs.get)
    tol = _tolerance(ew.opts)
    if diffs[worst] > tol:
        raise ExportError(f"EAGLE head graph at {worst}: max |ORT - PyTorch| logits = {diffs[worst]:.3g} > "
                          f"tolerance {tol:g} (all: {diffs}). Please report it with the head's config.json.")
    return diffs


def _draft_writer(cfg: ExportConfig, arch: ArchSpec, hf_w, model, tok, opts: GraphOptions):
    """The draft's graph writer and its PyTorch reference, for each --draft form."""
    spec = cfg.draft
    if spec.startswith("self:"):
        what = spec.split(":", 1)[1]
        if what in PRECISIONS:
            return LlamaGraphWriter(arch, hf_w, GraphOptions(what, int4_accuracy_level=opts.int4_accuracy_level)), \
                model, spec
        try:
            n = int(what)
        except ValueError:
            raise ExportError(f"--draft {spec!r}: use self:N (first N layers) or self:int4") from None
        if not 1 <= n < arch.n_layers:
            raise ExportError(f"--draft self:{n}: N must be in 1..{arch.n_layers - 1} (the target has "
                              f"{arch.n_layers} layers)")
        return LlamaGraphWriter(arch, hf_w, opts, n_layers=n), model, spec
    dsrc = sources.resolve(spec)
    dmodel, dtok = sources.load(dsrc)
    darch = arch_from_config(dmodel.config, cfg.max_len)
    _check_same_tokenizer(tok, dtok, arch.vocab_size, darch.vocab_size)
    return LlamaGraphWriter(darch, _hf_weights(dmodel), opts), dmodel, "model"
