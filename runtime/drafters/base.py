"""The drafter interface (`Drafter`) and its plugin (`DrafterPlugin`).

A drafter proposes the next tokens:
  start(seq, n_cached)   after the prompt is prefilled (a draft model prefills its own KV here;
                         its rows for the first n_cached tokens are still valid from the last call)
  draft_class(seq)       (n_classes > 1) the kind of step about to draft, read before adaptive k picks k
  propose(seq, k)        write up to k tokens into seq.draft_slots(k); return their Proposal
  propose_tree(seq, tree, cfg)  grow a token tree under the pending token (drafts_trees)
  accepted(seq, n_old, n_acc)   after the target kept n_acc of them (roll back own state)
  chain_scores() / chain_verified(m)  (scores_chains) each draft's estimated chance of being kept,
                         and how many of the chain's drafts the cost-sized verify call took; `chain_gate`
                         (when set) says after the first draft whether the rest could be verified
  finish(seq)            after the call: seq holds its prompt and output (a drafter that learns
                         from served requests keeps them)
  observe(tgt, seq, prop, logits)           after every verify call, before its acceptance: the
                         target's rows of every node it checked (a drafter that learns from them)
  observe_prefill(tgt, seq, past, n, logits)  after every prefill chunk's call: the same for its rows
The observers read the engine's own per-row outputs (its top-k: `tgt.last_topk`); the full logits
[T, V] are on the host for them only where `needs_logits` says so (else they may be None).

A proposal's q is the drafter's distribution of each proposed token (needed for lossless
sampling); None means the drafter is deterministic (q is one-hot on its token).

A `DrafterPlugin` describes one drafter to everything around the loop, as the export side's
`ExportPlugin` (export/drafters/base.py) describes what ships its models. Class attributes say its
name, summary, options (the RuntimeConfig fields and CLI flags it owns), place, the manifest
section it ships its models in and what it costs; methods, each with a default, say how the
drafter is built (`build`), which sections it needs (`needs`), whether it reads the target's
hidden states (`needs_features`), how its models load and make their sessions (`load`, `prime`)
and what they allow (`tree_engines`, `max_chain`, `aux_width`); `commands` are the `edgespec`
commands it brings (recycle's `warm`), as an export plugin brings its `train-<name>`. Each drafter
module of this package registers one instance of its subclass (`register`); every list of drafters
is read from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.sampling import SamplingConfig, penalize
from edgespec.runtime.state import Proposal, SeqState, chain


def penalized(logits: np.ndarray, seq: SeqState, i: int, sampling: SamplingConfig) -> np.ndarray:
    """The draft's logits for draft position i under the same repetition penalty as the target."""
    if sampling.repetition_penalty == 1.0:
        return logits
    return penalize(logits[None], seq.tokens, seq.n + i, sampling.repetition_penalty)[0]


class Drafter:
    """The interface every drafter implements; the defaults are a drafter with no state."""

    name = "none"
    drafts_trees = False  # propose_tree is available
    engine = None  # the model whose calls count as draft calls (stats); None: no model
    # an engine that runs the target's calls in its place (a fused target+head graph); one that drafts
    # inside the call may take a prefill's next tokens (`give_next`, runtime/prefill.py)
    verifier = None
    source = ""  # a combinator: which of its drafters made the last proposal ("" for the others, or nothing)
    # observe / observe_prefill read the call's full logits [T, V] on the host (False: at most what the
    # engine keeps beside them, its top-k output; the generator may then skip copying the logits back)
    needs_logits = False
    # chain_scores gives each draft of the last chain its estimated chance of being kept (with --adaptive,
    # chains are then cut per step to the prefix that pays by the width table; False: AdaptiveK's k)
    scores_chains = False
    # scores_chains drafters, set by the generator per call: where the chain budget stops at the first draft
    # that does not pay (a seeded call), a predicate on a chain's first path score; True: the budget keeps none
    # of the chain whatever follows, so draft no further (None: draft up to k)
    chain_gate = None
    # set with chain_gate: a predicate on the best first path score the drafter could draft this step; True:
    # the budget would keep none of any chain and no probe is due, so the step drafts nothing (None: draft)
    chain_idle = None
    # kinds of step this drafter tells apart before drafting (draft_class), each with its own acceptance
    # estimate in adaptive k (1: one estimate for every step)
    n_classes = 1

    def __init__(self) -> None:
        self.sampling = SamplingConfig()
        self.rng = np.random.default_rng()

    def configure(self, sampling: SamplingConfig, rng: np.random.Generator) -> None:
        """The generation's sampling settings and RNG (drafts are drawn as the target's tokens are)."""
        self.sampling, self.rng = sampling, rng

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        pass

    def draft_class(self, seq: SeqState) -> int:
        """The class (0 .. n_classes - 1) of the step about to draft for seq, read before adaptive k picks
        its k (prompt lookup: its match's length, a draft after a 3-token match is kept far more often);
        -1: nothing to draft this step (it decodes plainly, the policy is not asked)."""
        return 0

    def propose(self, seq: SeqState, k: int) -> Proposal:
        return chain(seq, 0)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        raise NotImplementedError(f"drafter {self.name!r} drafts chains only")

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        pass

    def kept_sources(self, n_kept: int) -> list[tuple[int, str]]:
        """The last step's first n_kept drafts (the kept ones, after accepted) as runs of (count,
        source label) in order; a drafter that mixes sources within a step (merged) splits them."""
        return [(n_kept, self.source)]

    def chain_scores(self) -> list[float]:
        """scores_chains drafters: the last chain's path scores, one per draft (the estimated chance
        the target keeps it and every draft before it)."""
        raise NotImplementedError(f"drafter {self.name!r} does not score its chains")

    def chain_verified(self, m: int) -> None:
        """scores_chains drafters: the verify call takes the first m drafts of the last chain (a
        cost-sized chain; called after propose, before accepted)."""

    def forget(self) -> None:
        """Drop state kept from the last call (the next prompt is prefilled in full)."""

    def finish(self, seq: SeqState) -> None:
        """After a call (also one cut short): seq.tokens[:seq.n] is its prompt and output."""

    def observe(self, tgt, seq: SeqState, prop: Proposal, logits: np.ndarray | None) -> None:
        """After each verify call by engine tgt, before its acceptance: prop (its root follows
        seq.tokens[:seq.n - 1]) was checked; logits [T, V] its rows (None unless needs_logits)."""

    def observe_prefill(self, tgt, seq: SeqState, past: int, n: int, logits: np.ndarray | None) -> None:
        """After each prefill chunk's call by engine tgt: the rows of seq.tokens[past:past + n];
        logits [n', V] (n' >= n, padded; None unless needs_logits)."""


@dataclass(frozen=True)
class Option:
    """A runtime option a drafter owns: a RuntimeConfig field and its CLI flag (--name-with-dashes)."""

    name: str  # RuntimeConfig field
    type: type  # its type (int, float, str or bool)
    default: object  # the value when unset; None: the folder's default (manifest defaults.options), then fallback
    help: str  # the CLI help text
    fallback: object = None  # edgespec's own default where default is None and the folder sets none
    choices: object = ()  # allowed values: a tuple, or a function returning one (empty: any of `type`)

    def allowed(self) -> tuple:
        return tuple(self.choices() if callable(self.choices) else self.choices)


@dataclass(frozen=True)
class Command:
    """An `edgespec <name>` command a drafter brings (recycle's `warm`); edgespec/cli.py adds one
    subcommand per command of every registered drafter."""

    name: str  # the subcommand
    module: str  # dotted module with add_arguments(parser) and run_command(args) -> exit status (imported by the CLI)
    help: str  # one line, for `edgespec --help`
    description: str  # the command's --help text


@dataclass
class BuildContext:
    """What a drafter is built from: the generator's engines, the target rows it reads and its config."""

    engines: object  # runtime.backends.Engines: the loaded models of the folder
    cfg: object  # the resolved RuntimeConfig
    tgt_rows: object  # runtime.state.TargetRows: the target's hidden states / hidden_aux rows by position
    store: dict  # what drafters keep for the generator's life, across drafter switches, by name (a suffix cache)

    @property
    def target_vocab(self) -> int:
        return self.engines.target.vocab_size


@dataclass(frozen=True)
class LoadContext:
    """Where a drafter's models run (runtime.backends.make_engines fills it)."""

    provider: str  # where the target runs
    model_provider: str  # where a drafter's full models (a separate draft model) run
    head_provider: str  # where small drafting graphs run (ONNX Runtime: never native TensorRT)
    threads: int | None  # intra-op threads (None: physical cores)
    cuda_graph: bool | None  # OrtModel's CUDA graph capture setting
    target: object  # the loaded target engine (some drafters share its KV)
    cfg: object  # the RuntimeConfig


class DrafterPlugin:
    """One drafter, as everything around the loop sees it: subclass it, set the class attributes and
    override the methods whose defaults do not fit (see the module docstring). Its module registers
    one instance (`register`)."""

    name: str = ""  # the --drafter value
    summary: str = ""  # what it proposes, one line (--help, errors, the server's abilities)
    aliases: tuple[str, ...] = ()  # other names it answers to
    order: int = 100  # position in listings (CLI help, the server, tune): the baseline first
    options: tuple[Option, ...] = ()  # the RuntimeConfig fields / CLI flags it owns
    section: type | None = None  # its manifest section (the models it ships); None: model-free
    export_hint: str = ""  # the export flag that ships its models, for errors ("" for model-free drafters)
    trees: bool = False  # grows token trees (--tree)
    draft_cost: float = 0.0  # one drafted token, in decodes (the sampled adaptive policy)
    reads_aux: bool = False  # its models read the target's hidden_aux rows (`aux_width` wide)
    pairs: bool = False  # a head drafter a combinator (hybrid) may pair with a lookup
    redrafts: bool = False  # under a grammar it drafts again after forced tokens its drafts missed (it needs
    #                         no target features of tokens not yet verified: runtime/constrain.py)
    commands: tuple[Command, ...] = ()  # the `edgespec` commands it brings

    def build(self, ctx: BuildContext) -> Drafter:
        """The drafter over a generator's engines and buffers."""
        raise NotImplementedError

    def needs(self, cfg) -> tuple[str, ...]:
        """The sections this drafter needs with this config: by default its own, if it ships one."""
        return (self.name,) if self.section is not None else ()

    def needs_features(self, cfg) -> bool:
        """Does it draft from the target's hidden states with this config?"""
        return False

    def load(self, manifest, section, ctx: LoadContext) -> object:
        """Its section's engine(s) (a drafter with a section loads it)."""
        raise NotImplementedError(f"drafter {self.name!r} ships a section but loads nothing")

    def prime(self, engine, widths, manifest) -> None:
        """Make its sessions and run each width once now (its first real call pays nothing); `engine`:
        what `load` gave."""

    def tree_engines(self, engine) -> tuple:
        """Its engines whose graphs must take trees for --tree."""
        return ()

    def max_chain(self, engine) -> int | None:
        """The longest chain it drafts; None: any k."""
        return None

    def aux_width(self, engine) -> int:
        """Width of the hidden_aux rows it reads (0 unless `reads_aux`)."""
        return 0
