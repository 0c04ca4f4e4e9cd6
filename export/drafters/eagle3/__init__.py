"""Exporting the `eagle3` drafter (`--eagle3-head`): an EAGLE-3 head (trained by `edgespec
train-eagle3`, or in the published HF EAGLE-3 layout) as its own graph (export/drafters/eagle3/graph.py);
the target's graphs then output the aux layers' features its fc reads. An EAGLE-3 folder given
to --eagle is taken as this drafter's."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, TrainCommand, register
from edgespec.export.drafters.eagle import DRAFT_VOCAB_OPTION
from edgespec.export.train.commands import add_common, common_fields, ready_data


def _is_eagle3_folder(folder: Path) -> bool:
    from edgespec.export.drafters.eagle3.head import is_eagle3_folder

    return is_eagle3_folder(folder)


def _source(cfg, src) -> Path | None:
    from edgespec.export.target.spec import ExportError

    if cfg.eagle3 in (None, "none", ""):
        return None
    path = Path(cfg.eagle3)
    if not path.is_dir():
        raise ExportError(
            f"--eagle3-head {cfg.eagle3}: not a folder. Hint: train one with `edgespec train-eagle3 --out {cfg.eagle3}`"
        )
    if not _is_eagle3_folder(path):
        raise ExportError(
            f"--eagle3-head {path}: its config.json does not declare LlamaForCausalLMEagle3. Hint: an "
            "EAGLE-1 head goes to --eagle"
        )
    return path


def _write(ctx, head_dir: Path) -> Shipped:
    from edgespec.export.drafters.eagle3.graph import write_eagle3

    ew, section = write_eagle3(
        head_dir,
        ctx.folder,
        ctx.arch,
        ctx.writer,
        ctx.index_t,
        ctx.head_opts,
        ctx.widths,
        ctx.chunk,
        ctx.cfg.eagle_draft_vocab,
    )
    ctx.step("EAGLE-3 head")
    return Shipped(section, ew)


def _validate(ctx, ew, tokens) -> dict:
    from edgespec.export.drafters.eagle3.graph import validate_eagle3
    from edgespec.export.target.spec import tolerance

    report = {"eagle3": validate_eagle3(ctx.folder, ew, ctx.reference_target(), tokens, tolerance(ew.opts))}
    ctx.step("validated EAGLE-3 head")
    return report


def _train_arguments(p) -> None:
    add_common(p, "head", minutes=35.0, epochs=5.0)
    p.add_argument(
        "--init",
        metavar="HEAD_DIR",
        help="fine-tune: start from this EAGLE-3 head's weights and draft "
        "vocabulary, with a fresh optimizer and schedule",
    )
    p.add_argument("--steps", type=int, default=3, help="draft steps unrolled per position in training (default 3)")
    p.add_argument(
        "--skip-copies",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="no loss where the answer repeats an 8-gram of its own context (default: skip)",
    )


def _train(a) -> int:
    from edgespec.export.drafters.eagle3.train import Eagle3TrainConfig, train_eagle3

    data = ready_data(a, aux=True)
    if data is None:
        return 2
    train_eagle3(
        Eagle3TrainConfig(
            **common_fields(a, data),
            skip_copies=a.skip_copies,
            init=a.init,
            n_steps=a.steps,
        )
    )
    return 0


PLUGIN = register(
    ExportPlugin(
        name="eagle3",
        flag="--eagle3-head",
        order=7,
        steps=2,
        source=_source,
        write=_write,
        validate=_validate,
        reads_aux=lambda cfg, head_dir: cfg.eagle3_features or head_dir is not None,
        claims=_is_eagle3_folder,
        title="an EAGLE-3 head",
        options=(
            DRAFT_VOCAB_OPTION,
            ExportOption(
                "eagle3",
                str,
                None,
                "EAGLE-3 head folder (HF EAGLE-3 layout, from `edgespec "
                "train-eagle3`) to include, beside any EAGLE head; turns on --eagle3-features (drafter "
                "eagle3). An EAGLE-3 folder given to --eagle is taken as this",
                flag="--eagle3-head",
                metavar="DIR",
            ),
            # the public name of the aux features flag (they are the layers EAGLE-3 picks; other drafters read
            # them too and turn them on themselves)
            ExportOption(
                "eagle3_features",
                bool,
                False,
                "target graphs also output hidden_aux [1, T, 3H]: the "
                "residual stream entering layers 2, L/2 and L-3 (EAGLE-3's fused low/mid/high features), "
                "for training or serving EAGLE-3 heads",
                late=True,
            ),
        ),
        train=TrainCommand(
            help="train an EAGLE-3 head for a target by self-distillation (CPU or GPU)",
            description="Trains an EAGLE-3 head (fc over the target's low/mid/high layer features, one decoder layer "
            "over "
            "[embedding ; hidden], its own LM head over a draft vocabulary) on self-distillation data that holds those "
            "features (made first when --data holds none), unrolling --steps draft steps per position (training-time "
            "test), loss = the target's own next token at each step. Resumable: run again with the same --out to "
            "continue. Writes config.json + model.safetensors in the EAGLE-3 layout (vLLM / SGLang load it) for "
            "`edgespec export --eagle3-head`.",
            arguments=_train_arguments,
            run=_train,
            module="edgespec.export.drafters.eagle3.train",
        ),
    )
)
