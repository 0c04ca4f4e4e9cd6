"""Exporting the `eagle3` drafter (`--eagle3-head`): an EAGLE-3 head (trained by `edgespec
train-eagle3`, or published by the official EAGLE repo, SpecForge or vLLM speculators: the layout is
found from the folder itself, export/drafters/eagle3/layouts.py) as its own graph
(export/drafters/eagle3/graph.py); the target's graphs then output the aux layers' features its fc
reads, at the layers the head names. An EAGLE-3 folder given to --eagle is taken as this drafter's.
`edgespec export-drafter --format speculators|eagle3-official` writes any of them in those layouts."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.cli_fields import config_from
from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, register
from edgespec.export.drafters.eagle import DRAFT_VOCAB_OPTION
from edgespec.export.train.commands import EPOCHS, MINUTES, BaseTrainConfig, add_train_flags


@dataclass(frozen=True)
class Eagle3TrainConfig(BaseTrainConfig):
    """`edgespec train-eagle3`'s config (train.py trains it); a field with a "help" is one of its flags."""

    minutes: float = field(default=35.0, metadata=MINUTES)  # wall-clock budget of this run
    epochs: float = field(default=5.0, metadata=EPOCHS)  # passes over the data in total (across runs)
    init: str | None = field(  # start from this EAGLE-3 head folder (fine-tuning: fresh optimizer and
        #                        schedule); ignored when `out` holds a checkpoint
        default=None,
        metadata={
            "help": "fine-tune: start from this EAGLE-3 head's weights and draft vocabulary, with a fresh "
            "optimizer and schedule",
            "metavar": "HEAD_DIR",
        },
    )
    batch_tokens: int = 4096  # tokens per optimizer step (sequences padded to the longest)
    n_steps: int = field(  # unrolled draft steps per row (training-time test)
        default=3,
        metadata={
            "help": "draft steps unrolled per position in training (default {default})",
            "flag": "--steps",
            "metavar": "STEPS",
        },
    )
    step_decay: float = 0.8  # loss weight of step s is step_decay^(s-1) (EAGLE-3's)
    feature_noise: float = 0.05  # Gaussian noise on the aux features, in per-dimension standard deviations
    #                              (the runtime's come from int8-activation kernels, not this fp32 model)
    skip_copies: bool = field(  # no loss where the answer repeats an 8-gram of its own context
        default=True,
        metadata={"help": "no loss where the answer repeats an 8-gram of its own context (default: skip)"},
    )


class Eagle3Plugin(ExportPlugin):
    name = "eagle3"
    flag = "--eagle3-head"
    order = 7
    validator = "edgespec.export.drafters.eagle3.graph:validate_eagle3"
    title = "EAGLE-3 head"
    options = (
        DRAFT_VOCAB_OPTION,
        ExportOption(
            "eagle3",
            str,
            None,
            "EAGLE-3 head folder to include (from `edgespec train-eagle3`, or as the official EAGLE repo, "
            "SpecForge or vLLM speculators publish it: the layout is read from the folder), beside any EAGLE "
            "head; turns on --eagle3-features (drafter eagle3) at the layers the head names. An EAGLE-3 folder "
            "given to --eagle is taken as this",
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
    )
    train_module = "edgespec.export.drafters.eagle3.train"
    train_aux = True
    train_help = "train an EAGLE-3 head for a target by self-distillation (CPU or GPU)"
    train_description = (
        "Trains an EAGLE-3 head (fc over the target's low/mid/high layer features, one decoder layer over "
        "[embedding ; hidden], its own LM head over a draft vocabulary) on self-distillation data that holds those "
        "features (made first when --data holds none), unrolling --steps draft steps per position (training-time "
        "test), loss = the target's own next token at each step. Resumable: run again with the same --out to "
        "continue. Writes config.json + model.safetensors in the EAGLE-3 layout (vLLM / SGLang load it) for "
        "`edgespec export --eagle3-head`."
    )

    formats = ("speculators", "eagle3-official")

    def source(self, cfg, src) -> Path | None:
        from edgespec.export.drafters import registry
        from edgespec.export.drafters.eagle3.layouts import inspect
        from edgespec.export.target.spec import ExportError
        from edgespec.export.train.checkpoint import CheckpointError

        path = super().source(cfg, src)
        # another drafter's folder given here is handed to it by sources() (its claims), not refused
        theirs = path is not None and any(p.claims(path) for n, p in registry().items() if n != self.name)
        if path is not None and not theirs and not self.claims(path):
            try:
                inspect(path)  # says why the folder is no EAGLE-3 head
            except (CheckpointError, ValueError) as e:
                raise ExportError(f"--eagle3-head {e}") from e
        return path

    def reads_aux(self, cfg, head_dir) -> bool:
        return cfg.eagle3_features or head_dir is not None

    def aux_layers(self, cfg, head_dir, n_layers: int) -> tuple[int, ...] | None:
        """The layers the head names (its layout's ids resolved to entering ids: layouts.py)."""
        if head_dir is None:
            return None
        return self._checkpoint(head_dir).check(None, None, n_layers).aux_layers

    def preflight(self, cfg, head_dir, target) -> None:
        """The head's config and tensor shapes against the target's, then its weights' values (NaN, inf)."""
        from edgespec.export.drafters._files import check_finite
        from edgespec.export.target.spec import ExportError
        from edgespec.export.train.checkpoint import CheckpointError

        ck = self._checkpoint(head_dir)
        try:
            if target is not None:
                ck.check(target.hidden_size, target.vocab_size, target.n_layers, cfg.max_len)
            else:
                ck.check(None, None, None, cfg.max_len)
            check_finite(ck.weights, {*ck.names.values(), *ck.fc_norm_names})  # the tensors it reads
        except (CheckpointError, ValueError) as e:
            raise ExportError(f"--eagle3-head {e}") from e
        if ck.ec.sliding_window:  # said once, here: it spans every position this export serves
            print(
                f"edgespec: --eagle3-head {head_dir}: sliding_window={ck.ec.sliding_window} >= --max-len "
                f"{cfg.max_len}: full attention",
                file=sys.stderr,
            )

    def _checkpoint(self, head_dir):
        from edgespec.export.drafters.eagle3.layouts import inspect
        from edgespec.export.target.spec import ExportError
        from edgespec.export.train.checkpoint import CheckpointError

        try:
            return inspect(Path(head_dir))
        except (CheckpointError, ValueError) as e:
            raise ExportError(f"--eagle3-head {e}") from e

    def claims(self, folder: Path) -> bool:
        from edgespec.export.drafters.eagle3.layouts import detect  # no torch: head.py's is_eagle3_folder

        return detect(Path(folder)) is not None

    def publish(self, folder: Path, fmt: str, out: Path, verifier: str | None = None) -> Path:
        from edgespec.export.drafters.eagle3.publish import publish

        return publish(folder, fmt, out, verifier)

    def write(self, ctx, head_dir: Path) -> Shipped:
        from edgespec.export.drafters.eagle3.graph import write_eagle3

        ew, section = write_eagle3(head_dir, ctx)
        ctx.step(self.title)
        return Shipped(section, ew)

    def train_arguments(self, p) -> None:
        add_train_flags(p, Eagle3TrainConfig, "head", ["init", "n_steps", "skip_copies"])

    def fit(self, a, data: str) -> None:
        from edgespec.export.drafters.eagle3.train import train_eagle3

        train_eagle3(config_from(Eagle3TrainConfig, a, data=data))


PLUGIN = register(Eagle3Plugin())
