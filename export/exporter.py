"""`edgespec export`: target (+ draft, EAGLE head, Medusa heads) -> engine folder of static-shape
ONNX graphs + manifest.json.

The folder is built under a temporary name next to the destination and renamed at the very end,
so an interrupted or failed export never leaves a folder that loads. What is written lives in
`write`, what describes it in `spec`, and the checks against PyTorch in `validate`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import shutil
import sys
import time
from pathlib import Path

from edgespec import __version__
from edgespec.engines import manifest as mf
from edgespec.export import sources
from edgespec.export.arch import ArchSpec, arch_from_config
from edgespec.export.eagle_graph import validate_eagle, validate_fused, write_eagle, write_eagle_fused
from edgespec.export.graph import GraphOptions, LlamaGraphWriter
from edgespec.export.lean_graph import probe_portable_ops
from edgespec.export.linears import one_row_int4_differs
from edgespec.export.medusa_graph import validate_medusa, write_medusa
from edgespec.export.reference import hf_weights, reference_model
from edgespec.export.spec import PRECISIONS, ExportConfig, ExportError, eagle3_layers, tolerance, with_host_prologue
from edgespec.export.validate import validate_model, validation_tokens
from edgespec.export.weights import write_weights
from edgespec.export.write import heads_dir, write_model
from edgespec.runtime.drafters.draft import DraftSection
from edgespec.runtime.drafters.eagle import EagleSection
from edgespec.runtime.drafters.medusa import MedusaSection

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


def _draft_writer(cfg: ExportConfig, arch: ArchSpec, hf_w, model, tok, opts: GraphOptions):
    """The draft's graph writer, its PyTorch model and its manifest kind, for each --draft form."""
    spec = cfg.draft
    if spec.startswith("self:"):
        what = spec.split(":", 1)[1]
        if what in PRECISIONS:
            return LlamaGraphWriter(arch, hf_w, GraphOptions(what, int4_accuracy_level=opts.int4_accuracy_level,
                                                             flavour="portable" if what == "fp16" else opts.flavour,
                                                             portable_ops=opts.portable_ops,
                                                             host_prologue=opts.host_prologue and what != "fp16")), \
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
    return LlamaGraphWriter(darch, hf_weights(dmodel), opts), dmodel, "model"


def _host_prologue(spec, writer: LlamaGraphWriter):
    """A target/draft entry whose graph was written with --host-prologue declares the prologue's inputs."""
    if not (writer.opts.host_prologue and writer.lean):  # the portable writer keeps its prologue
        return spec
    return dataclasses.replace(spec, graph=with_host_prologue(spec.graph, writer.arch.n_heads, writer.opts))


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
        raise ExportError(f"--force will not replace {out}: it is not an edgespec engine folder (no edgespec "
                          f"{mf.MANIFEST}) and holds {_describe(out)}. Hint: choose another --out, or move it away")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clean_stale_partials(parent: Path) -> list[Path]:
    """Remove the `.NAME.partial-PID` folders of exports whose process is gone (killed mid-way);
    says so on stderr. Returns what was removed."""
    removed = []
    if not parent.is_dir():
        return removed
    for p in sorted(parent.glob(".*.partial-*")):
        pid = p.name.rsplit("-", 1)[1]
        if not (p.is_dir() and pid.isdigit()) or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20
        shutil.rmtree(p, ignore_errors=True)
        print(f"edgespec: removed {p} ({size:.0f} MiB), left by an export (pid {pid}) that did not finish",
              file=sys.stderr)
        removed.append(p)
    return removed


def _eagle3_dir(cfg: ExportConfig, head_dir: Path | None) -> tuple[Path | None, Path | None]:
    """(EAGLE head folder, EAGLE-3 head folder): --eagle3-head, or an --eagle folder whose
    config.json declares an EAGLE-3 head."""
    from edgespec.export.eagle3_head import is_eagle3_folder

    e3 = None if cfg.eagle3 in (None, "none", "") else Path(cfg.eagle3)
    if e3 is not None and not e3.is_dir():
        raise ExportError(f"--eagle3-head {cfg.eagle3}: not a folder. Hint: train one with `edgespec train-eagle3 "
                          f"--out {cfg.eagle3}`")
    if head_dir is not None and is_eagle3_folder(head_dir):
        if e3 is not None:
            raise ExportError(f"--eagle {head_dir} is an EAGLE-3 head and --eagle3-head names another; pass it "
                              "once, as --eagle3-head")
        return None, head_dir
    if e3 is not None and not is_eagle3_folder(e3):
        raise ExportError(f"--eagle3-head {e3}: its config.json does not declare LlamaForCausalLMEagle3. Hint: an "
                          "EAGLE-1 head goes to --eagle")
    return head_dir, e3


def _dflash_dir(cfg: ExportConfig) -> Path | None:
    if cfg.dflash in (None, "none", ""):
        return None
    path = Path(cfg.dflash)
    if not path.is_dir():
        raise ExportError(f"--dflash {cfg.dflash}: not a folder. Hint: train one with `edgespec train-dflash "
                          f"--out {cfg.dflash}`")
    return path


def export(cfg: ExportConfig) -> Path:
    """Run the whole export; returns the finished folder."""
    cfg.check()
    t0 = time.perf_counter()
    src = sources.resolve(cfg.target)
    out = Path(cfg.out) if cfg.out else Path("engines") / src.name
    check_out(out, cfg.force)
    clean_stale_partials(out.parent)
    widths = cfg.widths()
    has_draft = cfg.draft is not None
    head_dir = heads_dir(cfg.eagle, src, "", "eagle")
    medusa_dir = heads_dir(cfg.medusa, src, "-medusa", "medusa")
    head_dir, eagle3_dir = _eagle3_dir(cfg, head_dir)
    dflash_dir = _dflash_dir(cfg)
    n_steps = (6 + (3 if has_draft else 0) + (3 if head_dir else 0) + (2 if medusa_dir else 0)
               + (2 if eagle3_dir else 0) + (2 if dflash_dir else 0))
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
                            aux_layers=(eagle3_layers(arch.n_layers)
                                        if cfg.eagle3_features or eagle3_dir or dflash_dir else ()),
                            two_row_matmuls=two_rows, flavour=cfg.flavour(),
                            portable_ops=probe_portable_ops() if cfg.flavour() in ("lean", "integer") else (),
                            host_prologue=cfg.host_prologue)
        head_opts = dataclasses.replace(opts, host_prologue=False)  # heads and the fused graph keep their prologue
        hf_w = hf_weights(model)
        writer = LlamaGraphWriter(arch, hf_w, opts)
        index_t = write_weights(writer.store.arrays, tmp / "target.weights")
        progress.step("wrote target.weights")
        target = _host_prologue(write_model(writer, tmp, "target", "target", widths, cfg.prefill_chunk,
                                            "target.weights", index_t), writer)
        progress.step("graph target.onnx")
        chat_file = _write_tokenizer(tok, tmp)
        progress.step("tokenizer")

        draft = draft_writer = draft_model = None
        if has_draft:
            draft_writer, draft_model, draft_kind = _draft_writer(cfg, arch, hf_w, model, tok, dataclasses.replace(
                opts, trees=False, aux_layers=()))  # a draft model drafts chains
            if draft_writer.opts.precision == cfg.precision and draft_model is model:
                weights_d, index_d = "target.weights", index_t  # self:N shares the target's weights
            else:
                weights_d = "draft.weights"
                index_d = write_weights(draft_writer.store.arrays, tmp / weights_d)
            progress.step("draft weights")
            draft = _host_prologue(write_model(draft_writer, tmp, "draft", draft_kind, cfg.draft_widths(),
                                               cfg.prefill_chunk, weights_d, index_d), draft_writer)
            progress.step("graph draft.onnx")
        eagle = eagle_fused = eagle_writer = None
        if head_dir is not None:
            eagle_writer, eagle = write_eagle(head_dir, tmp, arch, writer, index_t, head_opts, widths,
                                              cfg.prefill_chunk, cfg.eagle_draft_vocab)
            progress.step("EAGLE head")
            fuse_onto = target
            if opts.host_prologue:  # the fused graph is the target's with its own prologue
                in_graph = copy.copy(writer)
                in_graph.opts = head_opts
                fuse_onto = write_model(in_graph, tmp, "target_prologue", "target", widths, cfg.prefill_chunk,
                                        "target.weights", index_t)
            eagle_fused = write_eagle_fused(tmp, fuse_onto, eagle)
            if fuse_onto is not target:
                (tmp / fuse_onto.graph.file).unlink()
            progress.step("target+EAGLE graph")
        eagle3 = eagle3_writer = None
        if eagle3_dir is not None:
            from edgespec.export.eagle3_graph import write_eagle3

            eagle3_writer, eagle3 = write_eagle3(eagle3_dir, tmp, arch, writer, index_t, head_opts, widths,
                                                 cfg.prefill_chunk, cfg.eagle_draft_vocab)
            progress.step("EAGLE-3 head")
        dflash = dflash_writer = None
        if dflash_dir is not None:
            from edgespec.export.dflash_graph import write_dflash

            dflash_writer, dflash = write_dflash(dflash_dir, tmp, arch, writer, index_t, head_opts,
                                                 sorted({cfg.k + 1, cfg.prefill_chunk}))
            progress.step("DFlash drafter")
        medusa = medusa_writer = None
        if medusa_dir is not None:
            medusa_writer, medusa = write_medusa(medusa_dir, tmp, arch, writer, head_opts)
            progress.step("Medusa heads")
        sections = {}  # drafter name -> its manifest section
        if draft is not None:
            sections["draft"] = DraftSection(draft)
        if eagle is not None:
            sections["eagle"] = EagleSection(eagle, eagle_fused)
        if medusa is not None:
            sections["medusa"] = MedusaSection(medusa)
        sections |= {name: sec for name, sec in (("eagle3", eagle3), ("dflash", dflash)) if sec is not None}
        man = mf.Manifest(
            folder=tmp, name=out.name, edgespec_version=__version__,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
            source=mf.Source(kind=src.kind, path=src.path, draft=cfg.draft,
                             sha256=sources.sha256_of(src.path) if src.kind != "hub" else None),
            max_len=cfg.max_len, kv_bucket=cfg.kv_bucket, prefill_chunk=cfg.prefill_chunk,
            num_speculative_tokens=cfg.k, two_row_matmuls=two_rows, tokenizer_file="tokenizer.json",
            chat_template_file=chat_file, eos_token_ids=tuple(_eos_ids(model, tok)), bos_token_id=tok.bos_token_id,
            target=target, drafters=sections,
            # measured on this CPU (docs): adaptive prompt lookup beat every fixed k
            defaults=mf.Defaults(drafter="ngram", k=cfg.k, adaptive=True))
        man.save()
        if cfg.validate:
            n_val = cfg.prefill_chunk + sum(w for w in widths if w != cfg.prefill_chunk)
            tokens = validation_tokens(tok, n_val, arch.vocab_size)
            report = {"target": validate_model(tmp, "target", reference_model(model, writer), tokens,
                                               tolerance(writer.opts))}
            progress.step("validated target")
            if eagle_writer is not None:
                report["eagle"] = validate_eagle(tmp, eagle_writer, reference_model(model, writer), tokens,
                                                 tolerance(eagle_writer.opts))
                report["eagle_fused"] = validate_fused(tmp, tokens, tolerance(eagle_writer.opts))
                if report["eagle_fused"] is None:  # not bitwise the plain target: leave it out
                    man = man.replace_model("eagle_fused", None)
                    del report["eagle_fused"]
                    (tmp / "target_eagle.onnx").unlink()
                progress.step("validated EAGLE head")
            if eagle3_writer is not None:
                from edgespec.export.eagle3_graph import validate_eagle3

                report["eagle3"] = validate_eagle3(tmp, eagle3_writer, reference_model(model, writer), tokens,
                                                   tolerance(eagle3_writer.opts))
                progress.step("validated EAGLE-3 head")
            if dflash_writer is not None:
                from edgespec.export.dflash_graph import validate_dflash

                report["dflash"] = validate_dflash(tmp, dflash_writer, reference_model(model, writer), tokens,
                                                   tolerance(dflash_writer.opts))
                progress.step("validated DFlash drafter")
            if medusa_writer is not None:
                report["medusa"] = validate_medusa(tmp, medusa_writer, reference_model(model, writer), tokens,
                                                   tolerance(medusa_writer.opts))
                progress.step("validated Medusa heads")
            if has_draft:
                report["draft"] = validate_model(tmp, "draft", reference_model(draft_model, draft_writer), tokens,
                                                 tolerance(draft_writer.opts))
            for role, diffs in report.items():
                man = man.replace_model(role, dataclasses.replace(man.models()[role], validation=diffs))
            man.save()
        man = man.record_files()  # sizes and sha256 of the finished files (read only: the bytes stay)
        man.save()
        progress.step("validated")
        progress.close()
        if out.exists():
            check_out(out, cfg.force)  # again: the folder may have changed during the export
            shutil.rmtree(out)
        tmp.rename(out)  # the only step that makes the folder loadable
    except BaseException:
        progress.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"edgespec: exported {out} ({size:.0f} MiB) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for role, spec in man.models().items():
        if spec.validation:
            worst = max(spec.validation.values())
            what = "head logits vs the head's own graph" if role == "eagle_fused" else "|ORT - PyTorch| logits"
            print(f"  {role}: max {what} over {len(spec.validation)} phase widths = {worst:.2e}", file=sys.stderr)
    return out
