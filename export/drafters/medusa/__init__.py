"""Exporting the `medusa` drafter (`--medusa`): Medusa heads (trained by `edgespec train-medusa`,
or the heads shipped for the default model) as one graph of all K heads (export/drafters/medusa/graph.py)."""

from __future__ import annotations

from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, TrainCommand, register
from edgespec.export.train.commands import add_common, common_fields, ready_data


def _source(cfg, src):
    from edgespec.export.target.write import heads_dir

    return heads_dir(cfg.medusa, src, "-medusa", "medusa")


def _write(ctx, heads) -> Shipped:
    from edgespec.export.drafters.medusa.graph import write_medusa
    from edgespec.runtime.drafters.medusa import MedusaSection

    mw, spec = write_medusa(heads, ctx.folder, ctx.arch, ctx.writer, ctx.head_opts)
    ctx.step("Medusa heads")
    return Shipped(MedusaSection(spec), mw)


def _validate(ctx, mw, tokens) -> dict:
    from edgespec.export.drafters.medusa.graph import validate_medusa
    from edgespec.export.target.spec import tolerance

    report = {"medusa": validate_medusa(ctx.folder, mw, ctx.reference_target(), tokens, tolerance(mw.opts))}
    ctx.step("validated Medusa heads")
    return report


def _train_arguments(p) -> None:
    add_common(p, "heads", minutes=30.0, epochs=2.0)
    p.add_argument("--heads", type=int, default=4, help="K heads = longest draft chain (default 4)")
    p.add_argument("--layers", type=int, default=1, help="residual blocks per head (default 1)")


def _train(a) -> int:
    from edgespec.export.drafters.medusa.train import MedusaTrainConfig, train_medusa

    data = ready_data(a)
    if data is None:
        return 2
    train_medusa(
        MedusaTrainConfig(
            **common_fields(a, data),
            n_heads=a.heads,
            n_layers=a.layers,
        )
    )
    return 0


PLUGIN = register(
    ExportPlugin(
        name="medusa",
        flag="--medusa",
        order=9,
        steps=2,
        source=_source,
        write=_write,
        validate=_validate,
        options=(
            ExportOption(
                "medusa",
                str,
                "auto",
                "Medusa heads folder (from `edgespec train-medusa`) to include; "
                "'auto' (default): the heads shipped with edgespec when the target is the default model; "
                "'none': no heads",
            ),
        ),
        train=TrainCommand(
            help="train Medusa heads for a target by self-distillation (CPU or GPU)",
            description="Trains K Medusa heads (head i: a residual SiLU block on the target's last feature, through "
            "the "
            "target's own LM head rows of a draft vocabulary, predicting the token i+2 places ahead) on the same "
            "self-distillation data as train-eagle: the target's own answers to a built-in prompt set, with its hidden "
            "states (made first when --data holds none). Resumable: run again with the same --out to continue. Writes "
            "config.json + model.safetensors for `edgespec export --medusa`.",
            arguments=_train_arguments,
            run=_train,
            module="edgespec.export.drafters.medusa.train",
        ),
    )
)
