"""The export side of a drafter (`ExportPlugin`): what `edgespec export` and `edgespec train-<name>`
need to ship its models, as the runtime side's `DrafterPlugin` (runtime/drafters/base.py) is what
the loop needs to run them.

A drafter's export half is one subclass of `ExportPlugin`: class attributes say its name, flag,
place and ExportConfig fields (`ExportOption`); methods, each with a default, say where its models
come from (`source`), whether the target's graphs must output the aux features it reads
(`reads_aux`), its step of the export (`write`: its files into the folder being built, its
manifest section back), of the validation (`validate`: its graphs against PyTorch) and its
training command (`train_arguments`, `train`). This module imports nothing heavy: the CLI reads
every plugin's flags before torch is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExportOption:
    """An export option a drafter owns: an ExportConfig field and its `edgespec export` flag."""

    name: str  # ExportConfig field (and the flag's dest)
    type: type  # str, int or bool (bool: a flag that sets True)
    default: object  # the field's value when unset (also the flag's)
    help: str  # the CLI help text
    flag: str = ""  # the CLI flag; "": --name-with-dashes
    metavar: str | None = None  # the flag's value in --help (None: argparse's, from the name)
    late: bool = False  # listed after the core flags (it changes the target's graphs), not after --target

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class ExportContext:
    """What a drafter's export step is given: the target, written, and the folder being built."""

    cfg: object  # the ExportConfig
    folder: Path  # the temporary folder the export writes into (renamed when all is done)
    model: object  # the target's PyTorch model
    arch: object  # its ArchSpec (export.arch)
    hf_w: object  # its weights by Hugging Face name (sources.transformers.hf_weights)
    tok: object  # its tokenizer
    writer: object  # its graph writer (graph.LlamaGraphWriter); drafters read its weights and reference
    index_t: dict  # target.weights' index (weights.write_weights): graphs may read its arrays in place
    opts: object  # the target graph's GraphOptions
    head_opts: object  # the drafting graphs' GraphOptions (opts without the host prologue: they keep theirs)
    widths: list[int]  # the target's token widths: decode 1, verify 2..k+1, the prefill chunk
    target: object  # the target's manifest entry (engines.manifest.ModelSpec)
    step: Callable[[str], None]  # advance the progress bar by one step, saying what was done

    @property
    def chunk(self) -> int:
        return self.cfg.prefill_chunk

    def reference_target(self):
        """The target as PyTorch, computing with the weights its graph uses (int4: dequantized)."""
        from edgespec.export.target.checks.reference import reference_model

        return reference_model(self.model, self.writer)


@dataclass(frozen=True)
class Shipped:
    """What a drafter's export step gives back."""

    section: object  # its manifest section (the class is its runtime module's, runtime/drafters/<name>.py)
    state: object = None  # what its `validate` needs from the step (its graph writer, its PyTorch model)


class ExportPlugin:
    """One drafter, as `edgespec export` and its training command see it: subclass it, set the class
    attributes and override the methods whose defaults do not fit (see the module docstring)."""

    name: str = ""  # the drafter (runtime/drafters/<name>) whose manifest section it writes
    flag: str = ""  # the export flag naming its models (messages)
    order: int = 100  # its place in every list (flags, export steps, sections, commands): lower first
    steps: int = 2  # progress steps it takes (its writing and validating calls of ctx.step)
    options: tuple[ExportOption, ...] = ()  # the ExportConfig fields / export flags it owns
    title: str = ""  # what it ships ("DFlash drafter"): progress steps and, for a plugin that claims
    #                  folders, messages
    validator: str = ""  # "module:function" checking its graph against PyTorch (imported when called):
    #                       (folder, its Shipped.state, the reference target, tokens, tolerance) -> diffs per call
    shipped: str | None = None  # heads shipped for the default model sit in heads/<its name><shipped>, which
    #                             its option's 'auto' names; None: none are shipped
    # its `edgespec train-<name>` command ("" train_module: none)
    train_module: str = ""  # the training module, imported first (an ImportError there: the export extra is missing)
    train_help: str = ""  # one line, for `edgespec --help`
    train_description: str = ""  # the command's --help text
    train_aux: bool = False  # its training data holds the aux layers' features too

    # ---- the export ----------------------------------------------------------------------------------
    def source(self, cfg, src) -> object | None:
        """What it ships from this export (a folder, a model) or None: nothing. By default the folder its
        option (the ExportConfig field named as the drafter) names, or with 'auto' the one shipped for the
        default model (`shipped`); a bad argument raises ExportError."""
        from edgespec.export.target.spec import ExportError
        from edgespec.export.target.write import heads_dir

        arg = getattr(cfg, self.name)
        if self.shipped is not None:
            return heads_dir(arg, src, self.shipped, self.name)
        if arg in (None, "none", ""):
            return None
        path = Path(arg)
        if not path.is_dir():
            raise ExportError(
                f"{self.flag} {arg}: not a folder. Hint: train one with `edgespec train-{self.name} --out {arg}`"
            )
        return path

    def check(self, cfg) -> None:
        """Refuse bad option values (ExportError) before anything runs."""

    def reads_aux(self, cfg, source) -> bool:
        """Must the target graphs output hidden_aux (the aux layers' features) for it? source: its
        `source`, or None when it ships nothing."""
        return False

    def aux_layers(self, cfg, source, n_layers: int) -> tuple[int, ...] | None:
        """The target layers whose entering residual stream it reads as hidden_aux (ids as
        GraphOptions.aux_layers counts them: the stream *entering* layer i), when its checkpoint
        names them; None: the default low/mid/high (spec.aux_layers). Called only when `reads_aux`."""
        return None

    def preflight(self, cfg, source, target) -> None:
        """Read and check its checkpoint (config.json and tensor names, shapes and dtypes; no weights)
        against the target's shape (sources.TargetShape, or None when the target cannot be read
        before it loads), raising ExportError with the reason and what to do. Runs before the target
        loads, so a folder that cannot work costs seconds, not the target's export."""

    def claims(self, folder: Path) -> bool:
        """Is `folder` in its format, so that given to another drafter's flag it is taken as this one's?"""
        return False

    def write(self, ctx: ExportContext, source) -> Shipped:
        """Its files written into ctx.folder (calling ctx.step as it goes); its section back."""
        raise NotImplementedError

    def validate(self, ctx: ExportContext, state, tokens) -> dict:
        """{role: max diff per call, or None: a model that failed a check which leaves it out of the
        folder}. By default its one graph (role: its name) by `validate_graph`, then one progress step."""
        from edgespec.export.target.spec import tolerance

        report = {
            self.name: self.validate_graph(ctx.folder, state, ctx.reference_target(), tokens, tolerance(state.opts))
        }
        ctx.step(f"validated {self.title}")
        return report

    def validate_graph(self, folder: Path, writer, ref_target, tokens, tol: float) -> dict[str, float]:
        """Its graph against the PyTorch model `writer` (Shipped.state) was written from: `validator`'s."""
        import importlib

        module, function = self.validator.split(":")
        return getattr(importlib.import_module(module), function)(folder, writer, ref_target, tokens, tol)

    # ---- `edgespec export-drafter`: its checkpoints in the layouts serving engines load ----------------
    formats: tuple[str, ...] = ()  # the layouts `publish` writes ("speculators", "eagle3-official", ...)

    def publish(self, folder: Path, fmt: str, out: Path) -> Path:
        """Its checkpoint `folder` (any layout its flag reads) rewritten in layout `fmt` (one of
        `formats`) into the new folder `out`; what the layout cannot carry is refused (ExportError)."""
        raise NotImplementedError

    # ---- `edgespec train-<name>` ----------------------------------------------------------------------
    def train_arguments(self, p) -> None:
        """Add the command's flags to its argparse parser."""

    def train(self, a) -> int:
        """Run the command on its parsed flags: the self-distillation data made first when the folder holds
        none (commands.ready_data), then `fit`. Returns the exit status."""
        from edgespec.export.train.commands import ready_data

        data = ready_data(a, aux=self.train_aux)
        if data is None:
            return 2
        self.fit(a, data)
        return 0

    def fit(self, a, data: str) -> None:
        """Train on `data` (the data folders, comma-separated) with the command's flags."""
        raise NotImplementedError
