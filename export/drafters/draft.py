"""Exporting the `draft` drafter (`--draft`): a separate draft model with the target's tokenizer
(another model, the target's first N layers `self:N`, or the target in int4 `self:int4`), written
as a decoder graph that drafts one token a call after a prefill. No training command: a draft is
a model of its own."""

from __future__ import annotations

import dataclasses

from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, register


def _check_same_tokenizer(tok_t, tok_d, vocab_t: int, vocab_d: int) -> None:
    from edgespec.export.target.spec import ExportError

    if vocab_t != vocab_d:
        raise ExportError(
            f"draft vocab size {vocab_d} != target vocab size {vocab_t}: a draft must share "
            "the target's tokenizer. Hint: pick a draft from the same model family."
        )
    vt, vd = tok_t.get_vocab(), tok_d.get_vocab()
    if vt != vd:
        n_diff = sum(1 for k, v in vt.items() if vd.get(k) != v)
        raise ExportError(
            f"draft tokenizer differs from the target's in {n_diff} of {len(vt)} entries; "
            "a draft must share the target's tokenizer."
        )


def draft_writer(spec: str, ctx, opts):
    """The draft's graph writer, its PyTorch model and its manifest kind, for each --draft form."""
    from edgespec.export.target import sources
    from edgespec.export.target.arch import arch_from_config
    from edgespec.export.target.graph.builder import GraphOptions
    from edgespec.export.target.graph.writer import LlamaGraphWriter
    from edgespec.export.target.sources.transformers import hf_weights
    from edgespec.export.target.spec import PRECISIONS, ExportError

    arch = ctx.arch
    if spec.startswith("self:"):
        what = spec.split(":", 1)[1]
        if what in PRECISIONS:
            own = GraphOptions(
                what,
                int4_accuracy_level=opts.int4_accuracy_level,
                flavour="portable" if what == "fp16" else opts.flavour,
                portable_ops=opts.portable_ops,
                host_prologue=opts.host_prologue and what != "fp16",
            )
            return LlamaGraphWriter(arch, ctx.hf_w, own), ctx.model, spec
        try:
            n = int(what)
        except ValueError:
            raise ExportError(f"--draft {spec!r}: use self:N (first N layers) or self:int4") from None
        if not 1 <= n < arch.n_layers:
            raise ExportError(
                f"--draft self:{n}: N must be in 1..{arch.n_layers - 1} (the target has {arch.n_layers} layers)"
            )
        return LlamaGraphWriter(arch, ctx.hf_w, opts, n_layers=n), ctx.model, spec
    dsrc = sources.resolve(spec)
    dmodel, dtok = sources.load(dsrc)
    darch = arch_from_config(dmodel.config, ctx.cfg.max_len)
    _check_same_tokenizer(ctx.tok, dtok, arch.vocab_size, darch.vocab_size)
    return LlamaGraphWriter(darch, hf_weights(dmodel), opts), dmodel, "model"


class DraftPlugin(ExportPlugin):
    name = "draft"
    flag = "--draft"
    order = 3
    title = "draft model"
    options = (
        ExportOption(
            "draft",
            str,
            None,
            "draft: another model with the same tokenizer, self:N (the target's "
            "first N layers + its norm and LM head), or self:int4 (the target quantized to int4)",
        ),
    )

    def source(self, cfg, src):
        return cfg.draft  # a model source (or self:N / self:int4), not a folder of ours

    def write(self, ctx, spec: str) -> Shipped:
        """draft.onnx (+ draft.weights unless it reads the target's: self:N at the target's precision)."""
        from edgespec.export.target.graph.store import write_weights
        from edgespec.export.target.write import host_prologue_entry, write_model
        from edgespec.runtime.drafters.draft import DraftSection

        cfg = ctx.cfg
        writer, model, kind = draft_writer(spec, ctx, dataclasses.replace(ctx.opts, trees=False, aux_layers=()))
        if writer.opts.precision == cfg.precision and model is ctx.model:
            weights, index = "target.weights", ctx.index_t  # self:N shares the target's weights
        else:
            weights = "draft.weights"
            index = write_weights(writer.store.arrays, ctx.folder / weights)
        ctx.step("draft weights")
        widths = sorted({1, ctx.chunk})  # it drafts one token a call, after a prefill
        entry = write_model(writer, ctx.folder, "draft", kind, widths, ctx.chunk, weights, index)
        ctx.step("graph draft.onnx")
        return Shipped(DraftSection(host_prologue_entry(entry, writer)), (writer, model))

    def validate(self, ctx, state, tokens) -> dict:
        """Against its own PyTorch model (no progress step: both of its steps are the writing's)."""
        from edgespec.export.target.checks.reference import reference_model
        from edgespec.export.target.checks.validate import validate_model
        from edgespec.export.target.spec import tolerance

        writer, model = state
        return {
            "draft": validate_model(ctx.folder, "draft", reference_model(model, writer), tokens, tolerance(writer.opts))
        }


PLUGIN = register(DraftPlugin())
