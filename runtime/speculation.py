"""How a Generator speculates (a mixin it inherits): its drafter, k and token tree, and the adaptive
policies that size each step (adaptive k, tree and chain budgets), learned per configuration across
calls and chosen per call by how the call samples. The loop that runs the steps is generator.py."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from edgespec.runtime.adaptive import SAMPLED, AdaptiveK, TreeBudget, sampled_policy, sampled_tree_budget, width_line
from edgespec.runtime.backends import check_drafter
from edgespec.runtime.drafters import BuildContext, Drafter, make_drafter, registry, spec_of, tree_names
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.tree import TokenTree


class SpeculationSetup:
    """set_drafter / reconfigure and the policies of a Generator (its engines, cfg, manifest, drafter
    store and target rows are the Generator's)."""

    def prime_drafter(self, widths=()) -> None:
        """Make the current drafter's sessions now, so its first real call pays nothing."""
        for need in spec_of(self.drafter_name).needs(self.cfg):
            registry()[need].prime(self.engines.models[need], widths, self.manifest)

    @property
    def target(self):
        """The engine that runs the target's calls: the drafter's verifier (the fused target+EAGLE
        graph) or the plain target."""
        return self.drafter.verifier or self.engines.target

    @property
    def _give_next(self):
        """Where a prefill hands the tokens that follow its rows: the verifier's, if there is one
        (a verifier that drafts inside the call takes them), else nowhere."""
        v = self.drafter.verifier
        return v.give_next if v is not None else None

    def set_drafter(self, name: str, k: int | None = None) -> None:
        """Switch drafter / k between calls (the engines stay loaded); trees and adaptive k follow
        self.cfg (replace it to change them)."""
        k = self.cfg.k if k is None else k
        tgt = self.engines.target
        k_max = 0  # verify widths 2..k_max+1 must all exist (a draft may come up short)
        while k_max + 2 in tgt.widths:
            k_max += 1
        if name != "none" and not 1 <= k <= k_max:
            raise ValueError(
                f"k={k} outside 1..{k_max}: this folder has verify graphs up to "
                f"num_speculative_tokens={k_max}. Hint: re-export with a larger --k"
            )
        c = self.cfg
        check_drafter(name, self.engines, c.provider, c)
        spec = spec_of(name)
        ctx = BuildContext(self.engines, c, self.tgt_rows, self.drafter_store)
        self.drafter: Drafter = make_drafter(name, ctx)
        self.drafter_name = spec.name  # the registered name (an alias resolved)
        self.k = 0 if name == "none" else k
        self.tree = None  # the step's token tree (preallocated), when trees are on
        if c.tree.nodes and name != "none":
            c.tree.check(k_max + 1)
            if not self.drafter.drafts_trees:
                raise ValueError(f"drafter {name!r} drafts chains only; trees work with {', '.join(tree_names())}")
            verifying = [self.target]
            for need in spec.needs(c):
                grows = registry()[need].tree_engines
                verifying += grows(self.engines.models[need]) if grows is not None else []
            if not all(e.takes_tree for e in verifying):
                raise ValueError(
                    "this engine folder's graphs verify chains only (exported with --no-trees); "
                    "token trees need a folder re-exported without --no-trees"
                )
            self.tree = TokenTree(c.tree.nodes)
        # the policies learn costs and acceptance over calls: kept in the drafter store per configuration,
        # so switching drafters and back (a bench interleaving them prompt by prompt) resumes what they learned
        key = ("policies", spec.name, self.k, c.adaptive, c.tree.label if self.tree is not None else "")
        self._policies = self.drafter_store.get(key)
        if self._policies is None:
            self._policies = self.drafter_store[key] = self._new_policies()
        self.adaptive, self.tree_budget, self.chain_budget = (self._policies[n] for n in ("k", "tree", "chain"))
        self._budget = self.tree_budget or self.chain_budget  # the running call's (a sampled call: fixed costs)

    def _new_policies(self) -> dict:
        """Greedy calls' adaptive k ("k"), tree budget ("tree"), chain budget of a drafter that scores its
        chains ("chain": cut per step as trees are), and seeded calls' ("keyed", made at their first call)."""
        c, pol = self.cfg, {"k": None, "tree": None, "chain": None, "keyed": None}
        if c.adaptive and self.k > 0 and self.tree is None:
            if self.drafter.scores_chains:
                pol["chain"] = TreeBudget(self.k + 1, self.verify_costs(range(1, self.k + 2)))
            else:
                pol["k"] = AdaptiveK(self.k, self.verify_costs(range(1, self.k + 2)), classes=self.drafter.n_classes)
        if c.adaptive and self.tree is not None:  # trees cut each step to the size that pays
            pol["tree"] = TreeBudget(c.tree.nodes, self.verify_costs(range(1, c.tree.nodes + 1)))
        return pol

    def _sampled_adaptive(self) -> AdaptiveK | None:
        """Adaptive k for a sampled call (when adaptive is on): fixed relative costs instead of
        measured times and a fresh acceptance estimate, so every step's k, and with it a seed's
        output, follows from the seed, the folder and the settings, not from the machine's load."""
        if self.adaptive is None:
            return None
        costs, classes = self._recorded_costs(), self.drafter.n_classes
        return sampled_policy(self.k, self.drafter_name, self.cfg.provider, costs, classes)

    def _timed_sampled_policies(self) -> tuple[AdaptiveK | None, TreeBudget | None]:
        """Adaptive k and the tree / chain budget of seeded calls (their output does not depend on k:
        sampling.KeyedDraws) and of unseeded ones (fresh draws: no output to reproduce), so they follow
        measured times (a head's real cost per draft) as greedy calls do, with estimates of their own
        (what sampling keeps: the acceptance from the prior each call, AdaptiveK.begin; the costs learned
        across sampled calls) and one-draft probes while k = 0 wins."""
        if self._policies["keyed"] is None:
            adaptive = budget = None
            if self.adaptive is not None:
                costs = self.verify_costs(range(1, self.k + 2))
                adaptive = AdaptiveK(self.k, costs, SAMPLED, classes=self.drafter.n_classes)
            nodes = self.cfg.tree.nodes if self.tree_budget is not None else self.k + 1
            if self.tree_budget is not None or self.chain_budget is not None:
                budget = TreeBudget(nodes, self.verify_costs(range(1, nodes + 1)), SAMPLED)
            self._policies["keyed"] = (adaptive, budget)
        return self._policies["keyed"]

    def _recorded_costs(self, widest: int | None = None) -> dict[int, float] | None:
        """Verify costs in decodes by width 1..widest (None: k + 1, a chain's widest call), from the
        width table the export's probe measured for this folder's target on the CPU (manifest
        export_probe): the least-squares line through it, so a table measured under load (width 7
        cheaper than width 1 in one folder) still prices an extra row at what rows cost on average.
        None when the table lacks a width or its line does not rise (the caller's ROW_COST then)."""
        widest = widest or self.k + 1
        probe = self.manifest.export_probe if self.manifest is not None and self.cfg.provider == "cpu" else {}
        chosen = probe.get("chosen", self.manifest.target.precision) if probe else ""  # "int4-rowop" too
        ms = probe.get("ms_by_width", {}).get(chosen, {}) if probe else {}
        if not all(str(w) in ms for w in range(1, widest + 1)):
            return None
        slope, at_zero = width_line(ms)  # every recorded width, wider ones too
        if not (slope > 0 and at_zero + slope > 0):
            return None
        row = float(slope / (at_zero + slope))  # an extra row, in width-1 calls
        return {w: 1.0 + row * (w - 1) for w in range(1, widest + 1)}

    def reconfigure(self, **changes) -> None:
        """Change runtime options between calls (e.g. adaptive=True, tree=TreeConfig(...)), keeping
        the drafter and k unless given."""
        drafter, k = changes.pop("drafter", self.drafter_name), changes.pop("k", self.k or None)
        self.cfg = dataclasses.replace(self.cfg, **changes)
        self.set_drafter(drafter, k)

    def verify_costs(self, widths, repeats: int = 3) -> dict[int, float]:
        """Median seconds of one call of the verifying engine per width (measured once, then cached)."""
        tgt = self.target
        cache = self._verify_costs.setdefault(tgt is not self.engines.target, {})
        probe = np.zeros(max(tgt.widths), np.int64)
        for w in widths:
            if w not in cache:
                times = []
                for _ in range(repeats + 1):  # the first run is not counted (its bindings, first allocations)
                    t0 = time.perf_counter()
                    tgt.forward(probe[:w], 0, logits=False)  # as a greedy verify runs (a GPU keeps them)
                    times.append(time.perf_counter() - t0)
                cache[w] = float(np.median(times[1:]))
        self._tgt_valid = 0  # the probes wrote nothing, but do not trust a prefix across them
        return {w: cache[w] for w in widths}

    def _call_policies(self, sampling: SamplingConfig, keyed: bool, fresh: bool = False) -> AdaptiveK | None:
        """The adaptive k of one call (None: fixed k), its tree / chain budget set in self._budget and
        the drafter's chain gate. Greedy and seeded adaptive k follow measured times (k never changes
        their output), as do unseeded calls that draw from fresh entropy (`fresh`: nothing to reproduce;
        a server's requests without "seed"). A sampled call whose draws a caller fixed (an rng passed
        in, a seed with typical acceptance) has its k decide those draws, so it gets the fixed-cost
        policy (reproducible under load)."""
        adaptive, self._budget = self.adaptive, self.tree_budget or self.chain_budget
        if keyed or (fresh and not sampling.greedy):
            adaptive, self._budget = self._timed_sampled_policies()
        elif not sampling.greedy:
            adaptive = self._sampled_adaptive()
            if self._budget is not None:
                nodes = self.cfg.tree.nodes if self.tree_budget is not None else self.k + 1
                self._budget = sampled_tree_budget(nodes, self.cfg.provider, self._recorded_costs(nodes))
        if adaptive is not None:
            adaptive.begin()
        # a seeded call's chain budget stops at the first draft that does not pay, and a keyed draft takes no
        # randomness: a chain whose first draft will not pay is drafted no further (a k = 0 stretch of recycle
        # and merged then drafts one token a step, not k)
        gate = keyed and self.chain_budget is not None and self._budget is not None
        self.drafter.chain_gate = self._budget.stops_at_first if gate else None
        self.drafter.chain_idle = self._budget.idle_step if gate else None
        return adaptive
