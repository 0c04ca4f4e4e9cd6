"""Validation of a streamed target against PyTorch on a sampled model, in the streaming export's
memory: the first layers (two, or to the first of each attention kind) and about VOCAB_ROWS
vocabulary rows (plus the validation tokens'), written by the same writer from the same tensors
into a scratch folder, its stored layers checked to be the target file's bytes, its logits per
width against transformers' model of the same layers and rows computing with the graph's
weights. The whole model is never in memory, in PyTorch or in ONNX Runtime.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import sys
from collections.abc import Iterator, Mapping

import numpy as np

from edgespec.engines import rope
from edgespec.export.target.arch import ArchSpec
from edgespec.export.target.graph.streaming import StreamingWriter
from edgespec.export.target.quant.linears import Part
from edgespec.export.target.sources.safetensors import StreamedWeights
from edgespec.export.target.spec import ExportError

SHARED_READ_BYTES = 2**30  # float32 checkpoint reads kept for the next candidate's sampled model (1B: all, 0.76 GB)

VOCAB_ROWS = 4096  # about this many vocabulary rows (+ the validation tokens') in the sampled model


def sample_layers(arch: ArchSpec) -> tuple[int, ...]:
    """The layers the sampled model keeps: the first two, and on to the first layer of each
    attention kind (Gemma 3's sliding and full layers). A prefix, so each computes on the stream the
    full model gives it: a later layer fed the first layer's output runs out of its range (on Gemma
    3 270M layers [0, 5, 17] give 3x the logits, and the int8 activations' error then exceeds the
    full model's tolerance, 18 against 3), a false alarm rather than a check."""
    n = arch.n_layers
    last = min(1, n - 1)
    if arch.sliding_layers:
        full = [i for i in range(n) if i not in arch.sliding_layers]
        last = max(last, arch.sliding_layers[0], full[0] if full else 0)
    return tuple(range(last + 1))


def sample_rows(vocab: int, tokens: np.ndarray) -> np.ndarray:
    """The vocabulary rows the sampled model keeps: every row of a small vocabulary; else the
    validation tokens' rows and about VOCAB_ROWS evenly spaced ones (the last included)."""
    if vocab <= 2 * VOCAB_ROWS:
        return np.arange(vocab)
    return np.unique(np.concatenate([tokens, np.arange(0, vocab, vocab // VOCAB_ROWS), [vocab - 1]]))


class SampledWeights(Mapping):
    """A StreamedWeights seen as the sampled model's checkpoint: layer j is the target's layer
    layers[j]; the embedding and LM head keep the rows `rows`."""

    def __init__(self, base: StreamedWeights, layers: tuple[int, ...], rows: np.ndarray | None) -> None:
        self.base, self.layers, self.rows = base, layers, rows

    def _name(self, name: str) -> str:
        if name.startswith("model.layers."):
            j, rest = name[len("model.layers.") :].split(".", 1)
            return f"model.layers.{self.layers[int(j)]}.{rest}"
        return name

    def __getitem__(self, name: str) -> np.ndarray:
        if self.rows is not None and name in ("model.embed_tokens.weight", "lm_head.weight"):
            return self.base.rows(name, self.rows)  # those rows alone read
        return self.base[self._name(name)]

    def __contains__(self, name) -> bool:
        return self._name(name) in self.base

    def part(self, name: str, n_rows: int, w: np.ndarray, decode_blocks: bool) -> Part:
        """The base checkpoint's linears.Part of a tensor (sources/gguf.GgufWeights.part: a GGUF's
        kept blocks, of the sampled rows), or a float one."""
        base_part = getattr(self.base, "part", None)
        if base_part is None:
            return Part(name, 0, "float")
        rows = self.rows if self.rows is not None and name in ("model.embed_tokens.weight", "lm_head.weight") else None
        return dataclasses.replace(base_part(self._name(name), n_rows, w, decode_blocks, rows), hf_name=name)

    def __iter__(self) -> Iterator[str]:
        n = len(self.layers)
        for name in self.base:
            if not name.startswith("model.layers."):
                yield name
            elif int(name.split(".")[2]) < n:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


def sampled_arch(arch: ArchSpec, layers: tuple[int, ...], vocab: int) -> ArchSpec:
    """The architecture of the sampled model: those layers (their kinds kept), `vocab` rows."""
    where = {i: j for j, i in enumerate(layers)}
    return dataclasses.replace(
        arch,
        n_layers=len(layers),
        vocab_size=vocab,
        sliding_layers=tuple(where[i] for i in arch.sliding_layers if i in where),
        nope_layers=tuple(where[i] for i in arch.nope_layers if i in where),
    )


def sampled_config(hf_cfg, layers: tuple[int, ...], vocab: int):
    """The transformers config of the sampled model (layer_types sliced as the layers are)."""
    cfg = copy.deepcopy(hf_cfg)
    kinds = getattr(hf_cfg, "layer_types", None)
    cfg.num_hidden_layers = len(layers)
    if kinds:
        cfg.layer_types = [kinds[i] for i in layers]
    cfg.vocab_size = vocab
    return cfg


def validate_sampled(man, ctx, weights: StreamedWeights, hf_cfg, tokens: np.ndarray, tol: float) -> dict[str, float]:
    """The target validated on its sampled model (sample_layers, sample_rows): written by the same
    writer from the same tensors into a scratch folder beside the export, its stored layers checked
    to be the target file's bytes, its logits per width against transformers' model of the same
    layers and rows computing with the graph's weights. Returns the per-width differences."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.export.target.checks.reference import IntoModel, reference_model
    from edgespec.export.target.checks.validate import validate_model
    from edgespec.export.target.write import host_prologue_entry, write_model

    arch, opts, man_dir = ctx.arch, ctx.opts, ctx.folder
    layers = sample_layers(arch)
    rows = sample_rows(arch.vocab_size, tokens)
    full = len(rows) == arch.vocab_size
    view = SampledWeights(weights, layers, None if full else rows)
    scratch = man_dir / ".sampled"
    scratch.mkdir()
    try:
        v_arch = sampled_arch(arch, layers, len(rows))
        v_opts = dataclasses.replace(opts, aux_layers=())
        model = AutoModelForCausalLM.from_config(sampled_config(hf_cfg, layers, len(rows)), dtype=torch.float32)
        state = model.state_dict()  # the parameters themselves: filled one tensor at a time
        missing = [k for k in state if k not in view and not k.endswith("inv_freq")]
        if missing:
            raise ExportError(f"transformers' model of the sampled layers has weights the checkpoint lacks: {missing}")
        with torch.no_grad():
            for k, t in state.items():
                if k in view:
                    t.copy_(torch.from_numpy(np.array(view[k])))
        del state
        # the writer's weights (int4: dequantized) go straight into the model: no second copy
        w = StreamingWriter(v_arch, view, v_opts, scratch / "target.spool", reference=IntoModel(model))
        index = w.write_weights(scratch / "target.weights")
        _same_layers(w, ctx.writer, layers)
        spec = host_prologue_entry(
            write_model(w, scratch, "target", "target", ctx.widths, ctx.chunk, "target.weights", index), w
        )
        shutil.copy(man_dir / man.tokenizer_file, scratch / man.tokenizer_file)
        v_man = dataclasses.replace(
            man, folder=scratch, drafters={}, eos_token_ids=(), bos_token_id=None, chat_template_file=None, files={}
        )
        v_man.replace_model("target", spec).save()
        ref = reference_model(model, w, copy_model=False)  # (int8: its rows quantized as the graph does)
        ids = np.searchsorted(rows, tokens) if not full else tokens
        diffs = validate_model(scratch, "target", ref, ids, tol)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if ctx.cfg.progress:
        vocab = "every vocabulary row" if full else f"{len(rows):,} of {arch.vocab_size:,} vocabulary rows"
        print(
            f"edgespec: validated a sampled model against PyTorch (streaming export): layers {list(layers)} of "
            f"{arch.n_layers}, {vocab}; its layers' stored bytes are the target file's",
            file=sys.stderr,
        )
    return diffs


def _same_layers(sampled: StreamingWriter, target: StreamingWriter, layers: tuple[int, ...]) -> None:
    """The sampled model's stored layer arrays are the target's (same CRC-32, dtype and shape)."""
    for name, a in sampled.store.arrays.items():
        if name.startswith("l") and name[1 : name.find(".")].isdigit():
            j, rest = name[1:].split(".", 1)
            theirs = target.store.arrays.get(f"l{layers[int(j)]}.{rest}")
        elif name.startswith(("rope_", "block_sums")):
            theirs = target.store.arrays.get(name)
        else:
            continue  # embed, final_norm, lm_head: the sampled rows (check_floats covers the target's)
        if rope.rope_of(a) is not None:  # computed at load: the same parameters
            if rope.rope_of(theirs) != rope.rope_of(a) or theirs.shape != a.shape:
                raise ExportError(f"the sampled model's {name} is not the target's table")
        elif theirs is None or (theirs.crc, theirs.shape, theirs.dtype) != (a.crc, a.shape, a.dtype):
            raise ExportError(f"the sampled model's {name} is not the target's array as written")


class SharedReads(Mapping):
    """A streamed checkpoint (safetensors.StreamedWeights) whose float32 reads are kept in `cache`, up to
    SHARED_READ_BYTES in all, for the next candidate's view of the same checkpoint: the sampled
    model's tensors are read and dequantized once, not once per candidate (and the tied embedding's
    rows once, not twice). Everything else (part: a GGUF's blocks) is the checkpoint's own."""

    def __init__(self, base, cache: dict) -> None:
        self.base, self.cache = base, cache

    def _kept(self, key: tuple, read) -> np.ndarray:
        if key in self.cache:
            return self.cache[key]
        arr = read()
        if sum(a.nbytes for a in self.cache.values()) + arr.nbytes <= SHARED_READ_BYTES:
            self.cache[key] = arr
        return arr

    def __getitem__(self, name: str) -> np.ndarray:
        return self._kept((self.base.source(name), None), lambda: np.asarray(self.base[name]))

    def rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        key = (self.base.source(name), rows.tobytes())
        return self._kept(key, lambda: np.asarray(self.base.rows(name, rows)))

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def __contains__(self, name) -> bool:
        return name in self.base

    def __iter__(self):
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)
