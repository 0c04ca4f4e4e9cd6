"""The export side of a drafter (`ExportPlugin`): what `edgespec export` and `edgespec train-<name>`
need to ship its models, as the runtime side's `DrafterSpec` (runtime/drafters/base.py) is what
the loop needs to run them.

A plugin declares its ExportConfig fields and export flags (`ExportOption`), where its models come
from (`source`), whether the target's graphs must output the aux features it reads, its step of
the export (`write`: its files into the folder being built, its manifest section back) and of the
validation (`validate`: its graphs against PyTorch), and its training command (`TrainCommand`).
This module imports nothing heavy: the CLI reads every plugin's flags before torch is needed.
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
    hf_w: object  # its weights by Hugging Face name (reference.hf_weights)
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
        from edgespec.export.target.reference import reference_model

        return reference_model(self.model, self.writer)


@dataclass(frozen=True)
class Shipped:
    """What a drafter's export step gives back."""

    section: object  # its manifest section (the class is its runtime module's, runtime/drafters/<name>.py)
    state: object = None  # what its `validate` needs from the step (its graph writer, its PyTorch model)


@dataclass(frozen=True)
class TrainCommand:
    """A drafter's `edgespec train-<name>` command."""

    help: str  # one line, for `edgespec --help`
    description: str  # the command's --help text
    arguments: Callable  # (argparse parser) -> None: adds its flags
    run: Callable  # (argparse namespace) -> exit status
    module: str  # the training module, imported first (an ImportError there: the export extra is missing)


@dataclass(frozen=True)
class ExportPlugin:
    """One drafter, as `edgespec export` and its training command see it (see the module docstring)."""

    name: str  # the drafter (runtime/drafters/<name>.py) whose manifest section it writes
    flag: str  # the export flag naming its models (messages)
    source: Callable  # (cfg, target source) -> what it ships from (a folder, a model) or None: nothing
    #                   this export; a bad argument raises ExportError
    write: Callable  # (ExportContext, its source) -> Shipped: its files written into ctx.folder
    validate: Callable  # (ExportContext, Shipped.state, tokens) -> {role: max diff per call, or None:
    #                     a model that failed a check which leaves it out of the folder}
    steps: int = 2  # progress steps it takes (its writing and validating calls of ctx.step)
    options: tuple[ExportOption, ...] = ()  # the ExportConfig fields / export flags it owns
    check: Callable | None = None  # (cfg) -> None: refuse bad option values before anything runs
    reads_aux: Callable | None = None  # (cfg, its source or None) -> bool: the target graphs must output
    #                                   hidden_aux (the aux layers' features); None: never
    claims: Callable | None = None  # (folder) -> bool: a folder in its format, taken as its own when it is
    #                                 given to another drafter's flag; None: it claims none
    title: str = ""  # what a folder it claims is ("an X head"), for messages
    train: TrainCommand | None = None  # its `edgespec train-<name>` command; None: none
    order: int = 100  # its place in every list (flags, export steps, sections, commands): lower first
