"""The drafter interface (`Drafter`) and its descriptor (`DrafterSpec`).

A drafter proposes the next tokens:
  start(seq, n_cached)   after the prompt is prefilled (a draft model prefills its own KV here;
                         its rows for the first n_cached tokens are still valid from the last call)
  propose(seq, k)        write up to k tokens into seq.draft_slots(k); return their Proposal
  propose_tree(seq, tree, cfg)  grow a token tree under the pending token (drafts_trees)
  accepted(seq, n_old, n_acc)   after the target kept n_acc of them (roll back own state)
  finish(seq)            after the call: seq holds its prompt and output (a drafter that learns
                         from served requests keeps them)

A proposal's q is the drafter's distribution of each proposed token (needed for lossless
sampling); None means the drafter is deterministic (q is one-hot on its token).

A `DrafterSpec` describes one drafter to everything around the loop: its name, its options (the
RuntimeConfig fields and CLI flags it owns), the manifest section it ships its models in, how
those models are loaded, how the drafter is built and warmed, and what it costs. Each drafter
module of this package registers one (`register`); every list of drafters is read from there.
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

    def __init__(self) -> None:
        self.sampling = SamplingConfig()
        self.rng = np.random.default_rng()

    def configure(self, sampling: SamplingConfig, rng: np.random.Generator) -> None:
        """The generation's sampling settings and RNG (drafts are drawn as the target's tokens are)."""
        self.sampling, self.rng = sampling, rng

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        pass

    def propose(self, seq: SeqState, k: int) -> Proposal:
        return chain(seq, 0)

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        raise NotImplementedError(f"drafter {self.name!r} drafts chains only")

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        pass

    def forget(self) -> None:
        """Drop state kept from the last call (the next prompt is prefilled in full)."""

    def finish(self, seq: SeqState) -> None:
        """After a call (also one cut short): seq.tokens[:seq.n] is its prompt and output."""


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


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter, as everything around the loop sees it (see the module docstring)."""

    name: str  # the --drafter value
    summary: str  # what it proposes, one line (--help, errors, the server's abilities)
    build: object  # (BuildContext) -> Drafter
    aliases: tuple[str, ...] = ()  # other names it answers to
    section: type | None = None  # its manifest section (the models it ships); None: model-free
    load: object = None  # (manifest, section, LoadContext) -> its engine(s); None: it loads nothing
    warm: object = None  # (its engine(s), verify widths, manifest) -> None: make sessions now
    requires: object = None  # (cfg) -> names of the sections it needs; None: its own section, if any
    reads_features: object = None  # (cfg) -> bool: drafts from the target's hidden states; None: no
    trees: bool = False  # grows token trees (--tree)
    tree_engines: object = None  # (its engine(s)) -> engines whose graphs must take trees for --tree
    draft_cost: float = 0.0  # one drafted token, in decodes (the sampled adaptive policy)
    options: tuple[Option, ...] = ()  # the RuntimeConfig fields / CLI flags it owns
    order: int = 100  # position in listings (CLI help, the server, tune): the baseline first
    export_hint: str = ""  # the export flag that ships its models, for errors ("" for model-free drafters)
    max_chain: object = None  # (its engine(s)) -> the longest chain it drafts; None: any k
    aux_width: object = None  # (its engine(s)) -> width of the hidden_aux rows it reads; None: 0
    pairs: bool = False  # a head drafter a combinator (hybrid) may pair with a lookup
    redrafts: bool = False  # under a grammar it drafts again after forced tokens its drafts missed (it needs
    #                         no target features of tokens not yet verified: runtime/constrain.py)

    def needs(self, cfg) -> tuple[str, ...]:
        """The sections this drafter needs with this config."""
        if self.requires is not None:
            return tuple(self.requires(cfg))
        return (self.name,) if self.section is not None else ()

    def needs_features(self, cfg) -> bool:
        return bool(self.reads_features(cfg)) if self.reads_features is not None else False
