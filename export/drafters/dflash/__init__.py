"""Exporting the `dflash` drafter (`--dflash`): a DFlash block drafter in the DFlash layout (z-lab's
published DFlashDraftModel checkpoints, or `edgespec train-dflash`'s; layout.py reads and checks
both, before the target loads) as one graph that drafts a whole block a call (graph.py); the
target's graphs then output the features of the layers its config names (`aux_layers`). Its
checkpoints are written back in z-lab's layout by `edgespec export-drafter --format dflash-zlab`
(publish.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.cli_fields import config_from
from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, register
from edgespec.export.train.commands import EPOCHS, BaseTrainConfig, add_train_flags


@dataclass(frozen=True)
class TrainConfig(BaseTrainConfig):
    """`edgespec train-dflash`'s config (train.py trains it); a field with a "help" is one of its flags."""

    block_size: int = field(  # b: the anchor + b-1 drafted tokens per call
        default=8,
        metadata={
            "help": "block size b: the anchor + b-1 drafted tokens (default {default})",
            "flag": "--block",
            "metavar": "BLOCK",
        },
    )
    n_layers: int = field(  # drafter decoder layers (each starts as a copy of one of the target's last layers)
        default=1,
        metadata={"help": "drafter decoder layers (default {default})", "flag": "--layers", "metavar": "LAYERS"},
    )
    anchors: int = field(  # blocks trained per sequence per pass
        default=24, metadata={"help": "blocks trained per answer per pass (default {default})"}
    )
    decay: float = 0.8  # loss weight decay^(i-1) at block row i
    epochs: float = field(default=10.0, metadata=EPOCHS)  # passes over the data in total, new anchors each pass
    batch_tokens: int = 4096  # context tokens per optimizer step (sequences padded to the longest)


class DFlashPlugin(ExportPlugin):
    name = "dflash"
    flag = "--dflash"
    order = 8
    validator = "edgespec.export.drafters.dflash.graph:validate_dflash"
    title = "DFlash drafter"
    options = (
        ExportOption(
            "dflash",
            str,
            None,
            "DFlash block drafter folder (DFlash layout: z-lab's published drafters or `edgespec "
            "train-dflash`) to include; the target graphs then also output the features of the layers it reads "
            "(drafter dflash: one drafter call per step drafts a whole block)",
            metavar="DIR",
        ),
    )
    train_module = "edgespec.export.drafters.dflash.train"
    train_aux = True
    train_help = "train a DFlash block drafter for a target by self-distillation"
    train_description = (
        "Trains a DFlash drafter (a few non-causal decoder layers that draft a block of --block tokens in "
        "ONE call, reading the target's low/mid/high layer features of the verified prefix as injected keys/values; "
        "the target's embedding and LM head rows) on self-distillation data that holds those features (made first "
        "when --data holds none). Each pass trains --anchors random blocks per answer. Resumable: run again with the "
        "same --out to continue. Writes config.json + model.safetensors in the public DFlash layout for `edgespec "
        "export --dflash`."
    )

    formats = ("dflash-zlab",)

    def reads_aux(self, cfg, folder) -> bool:
        return folder is not None

    def aux_layers(self, cfg, folder, n_layers: int) -> tuple[int, ...]:
        """Its config's target_layer_ids, each + 1 (z-lab reads a layer's output: the stream entering the next)."""
        return self._layout(folder, n_layers=n_layers).cfg.aux_layers

    def preflight(self, cfg, folder, target) -> None:
        """config.json and the tensor shapes against the target's hidden size, vocabulary and depth, its
        block against --max-len, then its weights' values (NaN, inf)."""
        from edgespec.export.drafters._files import WeightsFileError, check_finite
        from edgespec.export.target.spec import ExportError

        if target is None:
            lay = self._layout(folder)
        else:
            lay = self._layout(folder, target.hidden_size, target.vocab_size, target.n_layers)
        b = lay.cfg.block_size
        if b > cfg.max_len:
            raise ExportError(
                f"{self.flag} {folder}: block_size {b} exceeds --max-len {cfg.max_len}: each drafting call computes "
                f"all {b} block rows at positions past the context (DFlash drafters are trained with 8 to 16). "
                "Hint: pass the block_size it was trained with"
            )
        try:
            check_finite(lay.weights)
        except WeightsFileError as e:
            raise ExportError(f"{self.flag} {e}") from e

    def claims(self, folder: Path) -> bool:
        from edgespec.export.drafters._files import read_json

        try:
            arch = read_json(folder / "config.json").get("architectures") or []
        except (OSError, ValueError, AttributeError):
            return False
        return bool({"DFlashDraftModel", "DFlash2DraftModel"} & set(arch))

    def _layout(self, folder, hidden_size=None, vocab_size=None, n_layers=None):
        from edgespec.export.drafters.dflash.config import DFlashFormatError
        from edgespec.export.drafters.dflash.layout import read_layout
        from edgespec.export.target.spec import ExportError

        try:
            return read_layout(folder, hidden_size, vocab_size, n_layers)
        except DFlashFormatError as e:
            raise ExportError(f"{self.flag} {e}") from e

    def write(self, ctx, folder: Path) -> Shipped:
        from edgespec.export.drafters.dflash.graph import write_dflash

        cfg = ctx.cfg
        widths = sorted({cfg.k + 1, cfg.prefill_chunk})  # context rows: a step's, a prompt chunk's
        dw, section = write_dflash(
            folder, ctx.folder, ctx.arch, ctx.writer, ctx.index_t, ctx.head_opts, widths, ctx.opts.aux_layers
        )
        ctx.step(self.title)
        return Shipped(section, dw)

    def publish(self, folder: Path, fmt: str, out: Path) -> Path:
        from edgespec.export.drafters.dflash.config import DFlashFormatError
        from edgespec.export.drafters.dflash.publish import publish_zlab
        from edgespec.export.target.spec import ExportError

        try:
            return publish_zlab(Path(folder), Path(out))
        except DFlashFormatError as e:
            raise ExportError(str(e)) from e

    def train_arguments(self, p) -> None:
        add_train_flags(p, TrainConfig, "drafter", ["block_size", "n_layers", "anchors"])

    def train(self, a) -> int:
        if a.block_size < 2:
            print(f"--block must be >= 2 (got {a.block_size}): the anchor and at least one draft", file=sys.stderr)
            return 2
        return super().train(a)

    def fit(self, a, data: str) -> None:
        from edgespec.export.drafters.dflash.train import train

        train(config_from(TrainConfig, a, data=data))


PLUGIN = register(DFlashPlugin())
