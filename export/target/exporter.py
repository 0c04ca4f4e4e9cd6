"""`edgespec export`: target (+ the models of the drafters asked for) -> engine folder of
static-shape ONNX graphs + manifest.json.

The folder is built under a temporary name next to the destination and renamed at the very end,
so an interrupted or failed export never leaves a folder that loads. The target is written and
validated here; each drafter that ships models does its part through its plugin
(export/drafters/: where its models come from, its files, its manifest section, its checks), in
the registry's order. Where the target's weights come from is its WeightSource
(sources/weight_source.py), what is written lives in `write`, what describes it in `spec`, and the
checks against PyTorch in `checks/`.
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import sys
import time
from pathlib import Path

from edgespec import __version__
from edgespec.engines import manifest as mf
from edgespec.export.drafters import ExportContext, registry
from edgespec.export.drafters import sources as drafter_sources
from edgespec.export.fit import fit_check, head_names, print_report
from edgespec.export.partials import clean_stale_partials, finish_partial, make_partial, remove_partial
from edgespec.export.target import sources
from edgespec.export.target.arch import arch_from_config, hf_sizes
from edgespec.export.target.checks.validate import validation_tokens
from edgespec.export.target.graph.builder import GraphOptions
from edgespec.export.target.graph.op_probe import one_row_int4_differs, probe_portable_ops
from edgespec.export.target.sources.weight_source import WeightSource, weight_source
from edgespec.export.target.spec import ExportConfig, ExportError, aux_layers, tolerance
from edgespec.export.target.write import describe_origins, host_prologue_entry, write_model

__all__ = ["ExportConfig", "ExportError", "export"]


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


def _eos_ids(model, tok) -> list[int]:
    """The stop ids: a model's (or sources.generation_config's) generation config, config and tokenizer."""
    ids = set()
    for src in (getattr(model, "generation_config", None), model.config, tok):
        e = getattr(src, "eos_token_id", None)
        ids.update([e] if isinstance(e, int) else (e or []))
    return sorted(i for i in ids if i is not None)


def _write_tokenizer(tok, folder: Path) -> str | None:
    """tokenizer.json (+ chat_template.jinja when the tokenizer has one); the template's file name."""
    tok_dir = folder / ".tok"
    tok.save_pretrained(tok_dir)
    shutil.copy(tok_dir / "tokenizer.json", folder / "tokenizer.json")
    shutil.rmtree(tok_dir)
    chat = getattr(tok, "chat_template", None)
    if not chat:
        return None
    (folder / "chat_template.jinja").write_text(chat)
    return "chat_template.jinja"


def _describe(folder: Path, n: int = 4) -> str:
    """What a folder holds, in a few words: '3 files, 2 folders (a.txt, b/, ...)'."""
    items = sorted(folder.iterdir())
    n_dirs = sum(p.is_dir() for p in items)
    names = [p.name + ("/" if p.is_dir() else "") for p in items[:n]] + (["..."] if len(items) > n else [])
    return f"{len(items) - n_dirs} files, {n_dirs} folders ({', '.join(names)})"


def check_out(out: Path, force: bool) -> None:
    """Refuse an --out that export could not, or must not, replace, before anything runs: a file,
    an existing folder without --force, or with --force a folder that is neither empty nor an
    edgespec engine folder (it could hold anything of the user's)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder; choose another --out")
    if not out.exists():
        return
    if not force:
        raise ExportError(f"{out} already exists; pass --force to replace it (or choose another --out)")
    if any(out.iterdir()) and not mf.is_engine_folder(out):
        raise ExportError(
            f"--force will not replace {out}: it is not an edgespec engine folder (no edgespec "
            f"{mf.MANIFEST}) and holds {_describe(out)}. Hint: choose another --out, or move it away"
        )


def export(cfg: ExportConfig) -> Path:
    """Run the whole export; returns the finished folder."""
    cfg.check()
    t0 = time.perf_counter()
    src = sources.resolve(cfg.target)
    out = Path(cfg.out) if cfg.out else Path("engines") / src.name
    check_out(out, cfg.force)
    plugins = registry()
    shipping = drafter_sources(cfg, src)  # name -> its folder (or model), for the drafters this export ships
    cfg, aux_readers = _preflight(cfg, src, shipping)
    cfg, probe = _decide_precision(cfg)
    clean_stale_partials(out.parent)
    progress = _Progress(6 + sum(plugins[name].steps for name in shipping), cfg.progress)
    tmp = make_partial(out)  # marked as edgespec's: only such folders are ever cleaned up
    try:
        source = weight_source(cfg, src, shipping)
        ctx, chat_file = _write_target(cfg, source, tmp, aux_readers, shipping, progress.step)
        shipped = {name: plugins[name].write(ctx, s) for name, s in shipping.items()}
        man = _manifest(ctx, source, out.name, chat_file, shipped, probe)
        man.save()
        man = _checked(man, ctx, shipped, source)
        progress.step("validated")
        progress.close()
        if out.exists():
            check_out(out, cfg.force)  # again: the folder may have changed during the export
            shutil.rmtree(out)
        finish_partial(tmp, out)  # the only step that makes the folder loadable
    except BaseException:
        progress.close()
        remove_partial(tmp)
        raise
    _report(out, man, t0)
    return out


def _preflight(cfg: ExportConfig, src: sources.Source, shipping: dict) -> tuple[ExportConfig, list[str]]:
    """Everything refused before a weight is read: the drafters first (their checks read the
    target's numbers without torch: refused in a second or two), then the target's config through
    transformers (_check_target). Returns cfg with its --max-len resolved (given, or the model's
    own, budgeted) and the drafters reading the target's aux layers."""
    plugins = registry()
    try:
        shape = sources.target_shape(src)  # config.json or the GGUF header
    except Exception:  # noqa: BLE001 - a config it cannot read: _check_target says what is wrong with it
        shape = None
        _check_target(cfg, src)
    context_line = []  # said once the target is known to be exportable (_check_target)
    cfg = _resolve_context(cfg, src, shape, context_line.append)
    for name, source in shipping.items():  # every drafter checkpoint checked before the target loads
        plugins[name].preflight(cfg, source, shape)
    aux_readers = [name for name, p in plugins.items() if p.reads_aux(cfg, shipping.get(name))]
    if shape is not None:  # the drafters together: the aux layers they read, from their configs alone
        _aux_layers(cfg, aux_readers, shipping, shape.n_layers)
    _check_target(cfg, src)  # family, rope type, sizes: refused in seconds, before any weight is read
    if cfg.progress and context_line:
        print(context_line[0], file=sys.stderr)
    return cfg, aux_readers


def _decide_precision(cfg: ExportConfig) -> tuple[ExportConfig, dict]:
    """cfg with its precision decided, and what --precision auto's per-CPU probe measured (the
    manifest's export_probe; {} where nothing was probed: the graph asked for decides)."""
    if cfg.precision != "auto":
        return cfg, {}
    if cfg.graph != "auto":
        return dataclasses.replace(cfg, precision="int8" if cfg.graph == "integer" else "int4"), {}
    from edgespec.export.target.checks.probe import choose_precision

    precision, probe = choose_precision(cfg, cfg.progress)
    return dataclasses.replace(cfg, precision=precision, int4_kernel=probe.get("int4_kernel", "nbits")), probe


def _write_target(
    cfg: ExportConfig, source: WeightSource, tmp: Path, aux_readers: list[str], shipping: dict, step
) -> tuple[ExportContext, str | None]:
    """The target's weights, graph and tokenizer in tmp, whichever source its weights come from:
    (what the drafters' plugins write from, the chat template's file name)."""
    name = source.src.name
    source.open()
    step(f"{source.verb} {name}")
    if cfg.progress:  # which path ran (not in --precision auto's scratch exports)
        print(f"edgespec: {name}: {source.describe()}", file=sys.stderr)
    _check_max_len(cfg, source.hf_cfg)
    arch = arch_from_config(source.hf_cfg, cfg.max_len)
    opts = graph_options(cfg, _aux_layers(cfg, aux_readers, shipping, arch.n_layers))
    writer, index_t = source.write(arch, opts, tmp)
    step("wrote target.weights")
    widths = cfg.widths()
    spec = write_model(writer, tmp, "target", "target", widths, cfg.prefill_chunk, "target.weights", index_t)
    target = host_prologue_entry(spec, writer)
    if cfg.progress:  # not in --precision auto's scratch exports (the probe's candidates)
        lines = describe_origins(target.weight_origins)
        print(f"edgespec: {name}'s linear weights in the {cfg.precision} target:", file=sys.stderr)
        print("\n".join("  " + line for line in lines), file=sys.stderr)
    step("graph target.onnx")
    chat_file = _write_tokenizer(source.tok, tmp)
    step("tokenizer")
    ctx = ExportContext(
        cfg=cfg,
        folder=tmp,
        model=source.model,
        arch=arch,
        hf_w=source.weights,
        tok=source.tok,
        writer=writer,
        index_t=index_t,
        opts=opts,
        head_opts=dataclasses.replace(opts, host_prologue=False),
        widths=widths,
        target=target,
        step=step,
    )
    return ctx, chat_file


def _manifest(
    ctx: ExportContext, source: WeightSource, name: str, chat_file: str | None, shipped: dict, probe: dict
) -> mf.Manifest:
    """The folder's manifest: the target's entry, each drafter's section, where the model came from."""
    cfg, src, tok = ctx.cfg, source.src, ctx.tok
    sha256 = sources.sha256_of(src.path) if src.kind != "hub" else None
    return new_manifest(
        cfg,
        ctx.folder,
        name,
        mf.Source(kind=src.kind, path=src.path, draft=cfg.draft, sha256=sha256),
        ctx.opts.two_row_matmuls,
        ctx.target,
        tokenizer_file="tokenizer.json",
        chat_template_file=chat_file,
        eos_token_ids=tuple(_eos_ids(source.generation_config(), tok)),
        bos_token_id=tok.bos_token_id,
        drafters={name: s.section for name, s in shipped.items()},
        # measured on this CPU (docs): adaptive prompt lookup beat every fixed k
        defaults=mf.Defaults(drafter="ngram", k=cfg.k, adaptive=True),
        export_probe=probe,
    )


def new_manifest(
    cfg: ExportConfig, folder: Path, name: str, source: mf.Source, two_rows: bool, target: mf.ModelSpec, **fields
) -> mf.Manifest:
    """The manifest of a folder exported now with cfg's numbers (fields: the others); the precision
    probe's sampled models are written with one too."""
    return mf.Manifest(
        folder=folder,
        name=name,
        edgespec_version=__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        source=source,
        max_len=cfg.max_len,
        kv_bucket=cfg.kv_bucket,
        prefill_chunk=cfg.prefill_chunk,
        num_speculative_tokens=cfg.k,
        two_row_matmuls=two_rows,
        target=target,
        **fields,
    )


def _checked(man: mf.Manifest, ctx: ExportContext, shipped: dict, source: WeightSource) -> mf.Manifest:
    """The saved manifest after the checks: every graph against PyTorch (unless --no-validate), the
    finished files' sizes and sha256, the heads' fit against this target (never raises)."""
    if ctx.cfg.validate:
        man = _validate(man, ctx, shipped, source)
    man = man.record_files()  # sizes and sha256 of the finished files (read only: the bytes stay)
    man.save()
    if ctx.cfg.fit_check and head_names(man):  # the heads against this target: never raises, a reason instead
        man = dataclasses.replace(man, head_fit=fit_check(ctx.folder))
        man.save()
    return man


def _report(out: Path, man: mf.Manifest, t0: float) -> None:
    """The finished folder's size and time, each model's validation, the heads' fit."""
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"edgespec: exported {out} ({size:.0f} MiB) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for role, spec in man.models().items():
        if spec.validation:
            worst = max(spec.validation.values())
            # a target+head graph: its head part is checked against the head's own graph
            fused = isinstance(spec, mf.ModelSpec) and spec.kind.startswith("target+")
            what = "head logits vs the head's own graph" if fused else "|ORT - PyTorch| logits"
            print(f"  {role}: max {what} over {len(spec.validation)} phase widths = {worst:.2e}", file=sys.stderr)
    print_report(man.head_fit, str(out))


def graph_options(cfg: ExportConfig, aux_layers: tuple[int, ...] = ()) -> GraphOptions:
    """The target graph's options for a config whose precision is decided (the probe's sampled
    models are written with them too)."""
    nbits = cfg.precision == "int4" and cfg.int4_kernel != "rowop"  # the row kernel's rows agree anyway
    two_rows = nbits and (
        cfg.two_row_matmuls == "on"
        or cfg.two_row_matmuls == "auto"
        and one_row_int4_differs(accuracy_level=cfg.int4_accuracy_level)
    )
    return GraphOptions(
        cfg.precision,
        int4_accuracy_level=cfg.int4_accuracy_level,
        int4_kernel="rowop" if cfg.int4_kernel == "rowop" else "nbits",
        int4_lm_head=cfg.int4_lm_head,
        int8_lm_head=cfg.int8_lm_head,
        trees=cfg.trees,
        aux_layers=aux_layers,
        two_row_matmuls=two_rows,
        flavour=cfg.flavour(),
        portable_ops=probe_portable_ops() if cfg.flavour() in ("lean", "integer") else (),
        host_prologue=cfg.host_prologue,
    )


def _check_target(cfg: ExportConfig, src: sources.Source) -> None:
    """What the graphs cannot compute, refused from the config alone (config.json or the GGUF
    header): the family, rope type and layer options (arch_from_config, the checks the export
    repeats on the loaded model), --max-len against max_position_embeddings, and sizes the int4
    blocks cannot cover. A hub id that cannot be reached is checked after its load."""
    hf_cfg = sources.target_config(src)
    if hf_cfg is None:
        return
    _check_max_len(cfg, hf_cfg)
    arch = arch_from_config(hf_cfg, cfg.max_len)
    bad = [f"{k}={v}" for k, v in hf_sizes(arch).items() if not isinstance(v, int) or v <= 0]
    if bad:
        raise ExportError(f"{src.path}: the config gives {', '.join(bad)}; every size must be a positive integer")
    block = GraphOptions("int4").int4_block_size
    inputs = {
        "hidden_size": arch.hidden_size,
        "num_attention_heads * head_dim": arch.n_heads * arch.head_dim,
        "intermediate_size": arch.intermediate_size,
    }
    odd = [f"{k} = {v}" for k, v in inputs.items() if v % block]
    if cfg.precision in ("int4", "auto") and odd:  # auto exports an int4 candidate first
        raise ExportError(
            f"--precision {cfg.precision} quantizes blocks of {block} inputs (int4), but {', '.join(odd)} is "
            f"not a multiple of {block}. Hint: export with --precision fp32 or int8"
        )


def _resolve_context(cfg: ExportConfig, src: sources.Source, shape, say) -> ExportConfig:
    """cfg with its max_len (budget.resolve_context, from the config's numbers alone; its figures to say)."""
    from edgespec.export.target import budget

    out = budget.resolve_context(cfg, src, shape, say)
    out.check_max_len(out.max_len)
    return out


def _check_max_len(cfg: ExportConfig, hf_cfg) -> None:
    max_pos = getattr(hf_cfg, "max_position_embeddings", None)
    if max_pos and cfg.max_len > max_pos:
        raise ExportError(f"--max-len {cfg.max_len} exceeds the model's max_position_embeddings {max_pos}")


def _aux_layers(cfg, readers: list[str], shipping: dict, n_layers: int) -> tuple[int, ...]:
    """The layers whose entering stream the target graphs output as hidden_aux: those every reader
    asks for (its checkpoint's, or the default low/mid/high); readers that ask for different ones
    are refused (the graphs output one hidden_aux)."""
    plugins = registry()
    wanted = {
        name: plugins[name].aux_layers(cfg, shipping.get(name), n_layers) or aux_layers(n_layers) for name in readers
    }
    if len(set(wanted.values())) > 1:
        asked = "; ".join(f"{plugins[n].flag} reads layers {list(v)}" for n, v in wanted.items())
        raise ExportError(f"the drafters read the target's features at different layers ({asked}); export them apart")
    layers = next(iter(wanted.values()), ())
    if layers and (min(layers) < 0 or max(layers) >= n_layers):
        raise ExportError(f"aux feature layers {list(layers)} are outside the target's 0..{n_layers - 1}")
    return tuple(layers)


def _validate(man: mf.Manifest, ctx: ExportContext, shipped: dict, source: WeightSource) -> mf.Manifest:
    """Every graph of the folder against PyTorch (the target here, each drafter's by its plugin), the
    differences recorded in the manifest (saved); a model a check leaves out is dropped with its graph.
    The target's check is its weight source's (a streamed target: on a sampled model of its layers)."""
    cfg, tmp = ctx.cfg, ctx.folder
    n_val = cfg.prefill_chunk + sum(w for w in ctx.widths if w != cfg.prefill_chunk)
    tokens = validation_tokens(ctx.tok, n_val, ctx.arch.vocab_size)
    report = {"target": source.validate(man, ctx, tokens, tolerance(ctx.opts))}
    ctx.step("validated target")
    plugins = registry()
    for name, s in shipped.items():
        report |= plugins[name].validate(ctx, s.state, tokens)
    for role, diffs in report.items():
        if diffs is None:  # not kept: its entry and its graph go (its weights may be another model's)
            (tmp / man.role_files()[role][0]).unlink()
            man = man.replace_model(role, None)
        else:
            man = man.replace_model(role, dataclasses.replace(man.models()[role], validation=diffs))
    man.save()
    return man
