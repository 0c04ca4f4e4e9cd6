"""Exporting the `medusa` drafter (`--medusa`): Medusa heads (trained by `edgespec train-medusa`,
the heads shipped for the default model, or heads the Medusa project's code wrote: official.py) as
one graph of all K heads (export/drafters/medusa/graph.py); and the way out, `export-drafter
--format medusa-official` (publish.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.cli_fields import config_from
from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, register
from edgespec.export.train.commands import EPOCHS, BaseTrainConfig, add_train_flags


@dataclass(frozen=True)
class MedusaTrainConfig(BaseTrainConfig):
    """`edgespec train-medusa`'s config (train.py trains it); a field with a "help" is one of its flags."""

    n_heads: int = field(  # K heads: drafts of up to K tokens per step
        default=4,
        metadata={"help": "K heads = longest draft chain (default {default})", "flag": "--heads", "metavar": "HEADS"},
    )
    n_layers: int = field(  # residual blocks per head
        default=1,
        metadata={"help": "residual blocks per head (default {default})", "flag": "--layers", "metavar": "LAYERS"},
    )
    epochs: float = field(default=2.0, metadata=EPOCHS)  # passes over the answer positions in total (across runs)
    init: str | None = field(  # start from this heads folder's weights and draft vocabulary (fine-tuning: a
        #                        fresh optimizer and schedule); ignored when `out` holds a checkpoint
        default=None,
        metadata={
            "help": "fine-tune: start from these heads' weights and draft vocabulary (e.g. the shipped ones, on "
            "your target's own answers: `edgespec answer-data`; a lower --lr such as 3e-4 suits), with a fresh "
            "optimizer and schedule; their --heads and --layers are kept",
            "metavar": "HEADS_DIR",
        },
    )
    batch_rows: int = 2048  # positions per optimizer step
    decay: float = 0.8  # loss weight of head i: decay**i (Medusa's)


class MedusaPlugin(ExportPlugin):
    name = "medusa"
    flag = "--medusa"
    order = 9
    shipped = "-medusa"
    validator = "edgespec.export.drafters.medusa.graph:validate_medusa"
    title = "Medusa heads"
    options = (
        ExportOption(
            "medusa",
            str,
            "auto",
            "Medusa heads folder to include: from `edgespec train-medusa`, or as the Medusa project publishes "
            "them (medusa_lm_head.pt / .safetensors + config.json; a Medusa-2 model folder, also its --target); "
            "'auto' (default): the heads shipped with edgespec when the target is the default model; "
            "'none': no heads",
        ),
    )
    train_module = "edgespec.export.drafters.medusa.train"
    train_help = "train Medusa heads for a target by self-distillation (CPU or GPU)"
    train_description = (
        "Trains K Medusa heads (head i: a residual SiLU block on the target's last feature, through the "
        "target's own LM head rows of a draft vocabulary, predicting the token i+2 places ahead) on the same "
        "self-distillation data as train-eagle: the target's own answers to a built-in prompt set, with its hidden "
        "states (made first when --data holds none). Resumable: run again with the same --out to continue. Writes "
        "config.json + model.safetensors for `edgespec export --medusa`."
    )

    formats = ("medusa-official",)

    def claims(self, folder) -> bool:
        from edgespec.export.drafters.medusa.official import detect

        return detect(folder) is not None

    def preflight(self, cfg, source, target) -> None:
        from edgespec.export.drafters.medusa.checkpoint import MedusaFormatError, preflight_heads
        from edgespec.export.target.spec import ExportError

        try:
            preflight_heads(
                source,
                None if target is None else target.hidden_size,
                None if target is None else target.vocab_size,
                cfg.target,
            )
        except MedusaFormatError as e:
            raise ExportError(f"{self.flag} {e}") from e

    def publish(self, folder, fmt, out):
        from edgespec.export.drafters.medusa.publish import publish_official

        return publish_official(folder, out)

    def write(self, ctx, heads) -> Shipped:
        from edgespec.export.drafters.medusa.graph import write_medusa
        from edgespec.runtime.drafters.medusa import MedusaSection

        mw, spec = write_medusa(heads, ctx.folder, ctx.arch, ctx.writer, ctx.head_opts, ctx.hf_w.get("lm_head.weight"))
        ctx.step(self.title)
        return Shipped(MedusaSection(spec), mw)

    def train_arguments(self, p) -> None:
        add_train_flags(p, MedusaTrainConfig, "heads", ["n_heads", "n_layers", "init"])

    def fit(self, a, data: str) -> None:
        from edgespec.export.drafters.medusa.train import train_medusa

        train_medusa(config_from(MedusaTrainConfig, a, data=data))


PLUGIN = register(MedusaPlugin())
