"""Exporting the `eagle` drafter (`--eagle`): an EAGLE-1/2 head (trained by `edgespec train-eagle`, one
the EAGLE repo publishes, or the head shipped for the default model; the layout is read from the
folder: export/drafters/eagle/checkpoint.py) as its own graph (export/drafters/eagle/graph.py) and
appended to the target's graph (the fused target+head graph, kept only where its target logits are
bitwise the plain graph's). Its folder is checked before the target loads (`preflight`), and
`edgespec export-drafter --format eagle1-official` writes a head in the official layout (`publish`)."""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field

from edgespec.cli_fields import config_from
from edgespec.export.drafters import ExportOption, ExportPlugin, Shipped, register
from edgespec.export.train.commands import EPOCHS, MINUTES, BaseTrainConfig, add_train_flags

# the draft-vocabulary cut; heads of other drafters that keep a frequency-ordered d2t read it too
DRAFT_VOCAB_OPTION = ExportOption(
    "eagle_draft_vocab",
    int,
    None,
    "keep the EAGLE head's N most frequent draft tokens (a cheaper head call; needs "
    "a head from train-eagle, which records that order); default 4096 for such heads, 0 keeps all",
    metavar="N",
)


@dataclass(frozen=True)
class TrainConfig(BaseTrainConfig):
    """`edgespec train-eagle`'s config (train.py trains it); a field with a "help" is one of its flags."""

    minutes: float = field(default=35.0, metadata=MINUTES)  # wall-clock budget of this run
    epochs: float = field(default=5.0, metadata=EPOCHS)  # passes over the data in total (across runs)
    init: str | None = field(  # start from this head folder's weights and draft vocabulary (fine-tuning:
        #                        a fresh optimizer and schedule); ignored when `out` holds a checkpoint
        default=None,
        metadata={
            "help": "fine-tune: start from this head's weights and draft vocabulary (e.g. the shipped one, on "
            "your own data; a lower --lr such as 3e-4 suits), with a fresh optimizer and schedule",
            "metavar": "HEAD_DIR",
        },
    )
    batch_tokens: int = field(  # tokens per optimizer step (sequences padded to the longest)
        default=4096,
        metadata={
            "help": "tokens per optimizer step, sequences padded to the longest (default {default}; larger "
            "batches keep bf16 matrix units busier, fewer steps per epoch)"
        },
    )
    ce_weight: float = 1.0  # token cross-entropy weight next to the feature regression
    n_steps: int = 2  # unrolled drafting steps per row (2 = EAGLE-3's training-time test)
    feature_noise: float = 0.05  # Gaussian noise on input features, in per-dimension standard deviations
    skip_copies: bool = field(  # False: `eagle` alone learns to continue the target's loops too
        default=True,
        metadata={
            "help": "no loss where the answer repeats an 8-gram of its own context (the target's loops, which "
            "prompt lookup drafts for free); --no-skip-copies trains on them too, so `eagle` alone learns to "
            "continue loops (default: skip)"
        },
    )


OFFICIAL_THETA = 10000.0  # the base eagle-llm 1.2.1 (PyPI) rotates with, whatever a head's config.json says


def rope_base(hc, override: float | None, target_theta: float | None) -> tuple[float | None, str]:
    """(the RoPE base the head graph rotates with, where it comes from) for a head read as `hc`: the
    --eagle-rope-theta override, else the base its config.json states, else its target's (None where
    the target's is not known yet)."""
    if override is not None:
        stated = f"{hc.rope_theta:g}" if hc.rope_theta is not None else "none (its target's)"
        return override, f"--eagle-rope-theta (its config.json: {stated})"
    if hc.rope_theta is not None:
        return hc.rope_theta, "its config.json"
    return target_theta, "its target's (its config.json names none)"


class EaglePlugin(ExportPlugin):
    name = "eagle"
    flag = "--eagle"
    order = 4
    shipped = ""
    steps = 3
    validator = "edgespec.export.drafters.eagle.graph:validate_eagle"
    title = "EAGLE head"
    options = (
        ExportOption(
            "eagle",
            str,
            "auto",
            "EAGLE-1/2 head folder to include: from `edgespec train-eagle`, or one the EAGLE repo publishes "
            "(pytorch_model.bin or model.safetensors, fp32/fp16/bf16; the layout is read from the folder); "
            "'auto' (default): the head shipped with edgespec when the target is the default model; 'none': no head",
        ),
        DRAFT_VOCAB_OPTION,
        ExportOption(
            "eagle_rope_theta",
            float,
            None,
            "the EAGLE head's RoPE base, in place of the one its config.json states: eagle-llm 1.2.1 from PyPI "
            "trains with 10000 whatever the config says (the EAGLE GitHub code applies it), so a head it trained "
            "with another rope_theta needs --eagle-rope-theta 10000; default: as the checkpoint states",
            metavar="THETA",
        ),
    )
    train_module = "edgespec.export.drafters.eagle.train"
    train_help = "train an EAGLE head for a target by self-distillation (CPU or GPU)"
    train_description = (
        "Step 1 (skipped when --data already holds shards): the target answers a built-in prompt set "
        "(chat, programming requests, stdlib code completion; no benchmark data) in batches, keeping its hidden "
        "states. Step 2: train the head on those answers (feature regression + the target's own next token, two "
        "unrolled draft steps). Resumable: run again with the same --out to continue. Writes config.json + "
        "model.safetensors (EAGLE checkpoint layout) for `edgespec export --eagle`."
    )

    formats = ("eagle1-official",)

    def check(self, cfg) -> None:
        from edgespec.export.target.spec import ExportError

        if cfg.eagle_draft_vocab is not None and cfg.eagle_draft_vocab < 0:
            raise ExportError(f"--eagle-draft-vocab must be >= 0 (got {cfg.eagle_draft_vocab}; 0 keeps them all)")
        theta = cfg.eagle_rope_theta
        if theta is not None and not (math.isfinite(theta) and theta > 1):
            raise ExportError(f"--eagle-rope-theta must be a finite RoPE base > 1 (got {theta:g}); e.g. 10000")
        if theta is not None and cfg.eagle in (None, "", "none"):
            raise ExportError("--eagle-rope-theta sets the EAGLE head's RoPE base, but --eagle none ships no head")

    def preflight(self, cfg, head_dir, target) -> None:
        """config.json and the tensors' names, shapes and dtypes against the target's sizes (no weights
        read), the --eagle-draft-vocab cut against the head's draft-token order, then its weights' values
        (NaN, inf)."""
        from edgespec.export.drafters._files import WeightsFileError, check_finite
        from edgespec.export.drafters.eagle.checkpoint import EMBED, inspect_head
        from edgespec.export.drafters.eagle.config_json import OFFICIAL
        from edgespec.export.target.spec import ExportError
        from edgespec.export.train.checkpoint import CheckpointError, prune_draft_vocab

        try:
            hf = inspect_head(head_dir, *((target.hidden_size, target.vocab_size) if target else (None, None)))
        except CheckpointError as e:
            raise ExportError(f"{self.flag} {e}") from e
        hc = hf.hc
        try:
            prune_draft_vocab(hc, {}, cfg.eagle_draft_vocab or 0, rows=())
        except CheckpointError as e:
            raise ExportError(f"{self.flag} {head_dir}: {e}") from e
        try:
            check_finite(hf.weights, {*hf.names, *((EMBED,) if hf.has_embed else ())})  # the tensors it reads
        except WeightsFileError as e:
            raise ExportError(f"{self.flag} {e}") from e
        theta, source = rope_base(hc, cfg.eagle_rope_theta, target.rope_theta if target else None)
        if cfg.eagle_rope_theta is not None or (hf.layout == OFFICIAL and theta != OFFICIAL_THETA):
            # the official layout's base depends on which upstream trained the head: said, with the way out
            hint = (
                f"; eagle-llm 1.2.1 from PyPI trains with {OFFICIAL_THETA:g} whatever the config says: for a head "
                f"it trained, pass --eagle-rope-theta {OFFICIAL_THETA:g}"
                if cfg.eagle_rope_theta is None
                else ""
            )
            print(f"edgespec: {self.flag} {head_dir}: RoPE base {theta:g}, from {source}{hint}", file=sys.stderr)

    def claims(self, folder) -> bool:
        """An EAGLE-1/2 head in either layout, given to another drafter's flag, is this one's."""
        from edgespec.export.drafters.eagle.checkpoint import is_eagle1_folder

        return is_eagle1_folder(folder)

    def publish(self, folder, fmt: str, out):
        """The head `folder` (either layout) in the official EAGLE layout; what it cannot carry is refused."""
        from edgespec.export.drafters.eagle.publish import publish_official
        from edgespec.export.target.spec import ExportError
        from edgespec.export.train.checkpoint import CheckpointError

        try:
            return publish_official(folder, out)
        except CheckpointError as e:
            raise ExportError(str(e)) from e

    def write(self, ctx, head_dir) -> Shipped:
        """eagle.onnx + eagle.weights, then target_eagle.onnx (the target's graph with the head appended)."""
        from edgespec.export.drafters.eagle.graph import write_eagle, write_eagle_fused
        from edgespec.export.target.write import write_model
        from edgespec.runtime.drafters.eagle import EagleSection

        ew, eagle = write_eagle(head_dir, ctx)
        ctx.step(self.title)
        fuse_onto = ctx.target
        if ctx.opts.host_prologue:  # the fused graph is the target's with its own prologue
            in_graph = copy.copy(ctx.writer)
            in_graph.opts = ctx.head_opts
            fuse_onto = write_model(
                in_graph, ctx.folder, "target_prologue", "target", ctx.widths, ctx.chunk, "target.weights", ctx.index_t
            )
        fused = write_eagle_fused(ctx.folder, fuse_onto, eagle)
        if fuse_onto is not ctx.target:
            (ctx.folder / fuse_onto.graph.file).unlink()
        ctx.step("target+EAGLE graph")
        return Shipped(EagleSection(eagle, fused), ew)

    def validate(self, ctx, ew, tokens) -> dict:
        """The head against PyTorch; the fused graph against the plain target and the head (None: left out)."""
        from edgespec.export.drafters.eagle.graph import validate_fused
        from edgespec.export.target.spec import tolerance

        report = {
            "eagle": self.validate_graph(ctx.folder, ew, ctx.reference_target(), tokens, tolerance(ew.opts)),
            "eagle_fused": validate_fused(ctx.folder, tokens, tolerance(ew.opts)),
        }
        ctx.step(f"validated {self.title}")
        return report

    def train_arguments(self, p) -> None:
        add_train_flags(p, TrainConfig, "head", ["init", "skip_copies", "batch_tokens"])

    def fit(self, a, data: str) -> None:
        from edgespec.export.drafters.eagle.train import train

        train(config_from(TrainConfig, a, data=data))


PLUGIN = register(EaglePlugin())
