"""The `eagle` drafter: an EAGLE head (one decoder layer) drafting from the target's own hidden
states over its most frequent draft tokens, as chains or EAGLE-2 style dynamic trees; on the CPU
its first draft comes out of the target's verify call: the drafter verifies with its own engine,
the fused target+head graph (fused.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.engines.manifest import Manifest, ManifestError, ModelSpec, check_decode, check_head
from edgespec.runtime.drafters import Option, register
from edgespec.runtime.drafters._head import MIN_CONFIDENCE_OPTION, ChainHeadPlugin, HeadDrafter
from edgespec.runtime.prefill import prefill
from edgespec.runtime.state import SeqState, chain


@dataclass(frozen=True)
class EagleSection:
    """The manifest section of a folder exported with an EAGLE head."""

    head: ModelSpec  # the head's graph: (token, feature) pairs -> draft-vocabulary logits, own KV
    fused: ModelSpec | None = None  # the target graph with the head appended (FUSED_PREFIX names), or None

    def models(self) -> dict[str, ModelSpec]:
        return {"eagle": self.head} | ({"eagle_fused": self.fused} if self.fused is not None else {})

    def check(self, m: Manifest) -> None:
        for spec in self.models().values():
            check_decode(m, spec)
        check_head(m, self.head, "EAGLE head", "re-export with a head trained for this target")
        f = self.fused
        if f is not None and (f.widths() != m.target.widths() or f.vocab_size != m.target.vocab_size):
            raise ManifestError(
                f"{m.folder}: the fused target+EAGLE graph has widths {f.widths()}, the target "
                f"{m.target.widths()}; re-export"
            )


@dataclass
class EagleEngines:
    """The loaded head, and the fused target+head graph when it verifies in the target's place."""

    head: object  # engines.base.HeadEngine
    fused: object | None  # fused.FusedVerifier, sharing the target's KV; None: not used


class EagleDrafter(HeadDrafter):
    """EAGLE: a one-layer head drafts from the target's own features (chain).

    Head row j holds the pair (f_j, token_{j+1}), f_j = the target's hidden state at position j
    (`tgt_features`: the generator's TargetRows.features, current after every target call). Its
    output predicts f_{j+1} and so token_{j+2}. One step: catch up on the pairs the target has
    verified since the last step (one call, true features; its last row drafts d_1), then k-1
    calls that feed the head its own predicted feature: (f^_{n-1}, d_1) -> d_2, ... Those
    speculative rows sit past `dft_past` and are overwritten by the next catch-up, so rejection
    needs no rollback work.

    Fused (`verifier`: the target+head graph, fused.FusedVerifier, verifying in the target's
    place): the verify call itself computes the head's rows for the pairs it verifies, taking the
    target's argmax as each row's next token, which under greedy decoding is the token that does
    follow every accepted row and the bonus row. So when greedy (no repetition penalty) and the
    head was caught up to the call's past_len, the committed rows catch it up and the bonus row's
    head logits are d_1: no head call for d_1. Sampled, a committed row's next token is a draw: the
    head rows hold true pairs up to the first committed row whose drawn token is not its argmax
    (FusedVerifier.argmax_led), and d_1 comes free where every one was (at t = 0.7 most are); the
    catch-up call runs from that row otherwise. A sampled call verifies with the fused graph only in
    its prefill and the steps whose head drafted (a k = 0 stretch pays no head rows; the prefill pays
    them, ~7% of TTFT, so the first draft needs no catch-up over the prompt). Whatever the head's state, a
    draft is drawn from the q its logits give and verified against that q, so output never depends
    on it beyond the draws a fixed rng makes.
    """

    name = "eagle"

    def __init__(
        self, head, tgt_features: np.ndarray, target_vocab: int, min_confidence: float = 0.0, verifier=None
    ) -> None:
        super().__init__(head.d2t, target_vocab, min_confidence, 64)
        self.head = self.engine = head
        self.tgt_features = tgt_features
        self.dft_past = 0  # head rows holding true pairs 0..dft_past-1
        self._feat = np.zeros((1, tgt_features.shape[1]), tgt_features.dtype)  # f^ fed back
        n_tree = max(head.widths)  # tree scratch: per node feature, head row, head-call inputs
        self._tree_feat = np.zeros((n_tree, tgt_features.shape[1]), tgt_features.dtype)
        self._tree_in = np.zeros((n_tree, tgt_features.shape[1]), tgt_features.dtype)
        self._tree_par = np.zeros(n_tree, np.int64)
        self._tree_rows = np.zeros(n_tree, np.int64)
        self._fused = verifier  # the fused target+head graph (FusedVerifier), or None (verifier says when it is used)
        self._fused_ready = False  # the last target call caught the head up (d_1 is in verifier.last_head())
        self._fused_next = False  # sampled: the next target call runs the fused graph (the call's prefill, a
        #                           step whose head drafted); greedy calls always do

    @property
    def verifier(self):
        """The fused graph, where its head rows are used (no repetition penalty, no grammar mask): greedy,
        every call; sampled, the call's prefill (its rows take the prompt's next tokens: the head starts
        caught up, not with a catch-up call over the whole prompt that adaptive k would read as the
        head's cost per draft) and the steps whose head drafted (the head was caught up to the call's
        past_len, so its rows may catch it up further: _caught_up_by_target). A sampled k = 0 stretch
        verifies with the plain target: the fused graph would compute head rows no step reads. Both
        share the target's KV."""
        p = self.sampling
        if p.repetition_penalty != 1.0 or p.masked or not (p.greedy or self._fused_next):
            return None
        return self._fused

    def configure(self, sampling, rng) -> None:
        super().configure(sampling, rng)
        self._fused_next = True  # (sampled: the call's prefill)

    def _caught_up_by_target(self, seq: SeqState, past_len: int, prefill: bool = False) -> None:
        """After a target call at past_len whose rows are committed (prefill: a prefill's, which gave each
        row its next token but the last): did its head rows catch us up? Greedy, all of them; sampled,
        those before the first row whose committed next token is not the argmax its head row took."""
        v = self._fused
        ran = v is not None and v.take_commit()  # (the call ran it: a pair's own head may have verified)
        self._fused_next, self._fused_ready = False, False
        if not ran or self.dft_past != past_len:
            return
        if self.sampling.greedy:
            self._fused_ready, self.dft_past = True, seq.n - 1
            return
        n_rows = seq.n - 1 - past_len
        if prefill:
            good = n_rows - 1 + (v.last_argmax() == seq.tokens[seq.n - 1])
        else:
            good = v.argmax_led(seq.tokens[past_len + 1 : seq.n])
        self._fused_ready, self.dft_past = good == n_rows, past_len + good

    def forget(self) -> None:
        self.dft_past = 0

    def start(self, seq: SeqState, n_cached: int = 0) -> None:
        # pair j needs tokens j, j+1 of the common prefix and f_j: valid for j <= n_cached - 2
        self.dft_past = min(self.dft_past, max(n_cached - 1, 0))
        self._caught_up_by_target(seq, n_cached, prefill=True)  # the prefill ran from n_cached

    def _catch_up(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        """Run the head over the pairs the target verified since the last step (j0..n-2, true
        features; at least the pending token's); its last row drafts d_1. Returns those logits
        [Vd] and writes that row's predicted feature into feat_out [H]."""
        n, head, j0 = seq.n, self.head, self.dft_past
        self.dft_past, logits = prefill(head, seq.tokens[j0 + 1 : n], j0, features=self.tgt_features[j0 : n - 1])
        feat_out[:] = head.last_hidden((n - 2 - j0) % max(head.widths) + 1)[-1]  # last row of the last chunk
        return logits

    def _first(self, seq: SeqState, feat_out: np.ndarray) -> np.ndarray:
        """The head's logits [Vd] for d_1, its predicted feature into feat_out [H]: from the fused
        verify when that caught the head up, else from a catch-up call."""
        if not self._fused_ready:
            return self._catch_up(seq, feat_out)
        logits, feat = self._fused.last_head()
        feat_out[:] = feat
        return logits

    def propose(self, seq: SeqState, k: int):
        n, head = seq.n, self.head
        k = min(k, head.max_len - n)
        self.expected = 0.0
        if k <= 0:
            return chain(seq, 0)
        logits = self._first(seq, self._feat[0])
        slots = seq.draft_slots(k)
        path = 1.0  # the head's probability of d_1..d_{i+1} all being right, ~ P(d_{i+1} is kept)
        for i in range(k):
            slots[i], conf = self._choose(logits, seq, i)
            path *= conf
            if path < self.min_confidence:
                k = i  # a row that is probably wasted: propose d_1..d_i only
                break
            self.expected += path
            self._fused_next = True
            if i + 1 < k:  # speculative row at slot n-1+i: (f^, d_{i+1})
                logits = head.forward(slots[i : i + 1], n - 1 + i, features=self._feat)[-1]
                head.commit(n - 1 + i, 1)
                self._feat[0] = head.last_hidden(1)[0]
        return chain(seq, k, None if self.sampling.greedy or k == 0 else self._q[:k])

    def propose_tree(self, seq: SeqState, tree, cfg) -> None:
        """EAGLE-2 style dynamic tree: each depth adds the top-`branch` children of the last
        depth's expanded nodes, best path probability first (the head's own probabilities
        multiplied along the path) while the node budget lasts; the `beam` best of them are
        expanded next: the head runs once over all drafted nodes (a forest under the committed
        context, tree attention) for their children."""
        n, head = seq.n, self.head
        if head.max_len - n < cfg.depth + 1 or tree.limit < 2:
            return
        feat = self._tree_feat
        logits = self._first(seq, feat[0])[None]  # [rows, Vd]: the head's logits of the last expanded nodes
        rows_of = self._tree_rows  # each node's row in `logits`
        rows_of[0] = 0
        frontier = [0]
        for d in range(1, cfg.depth + 1):
            added = self._add_children(tree, frontier, lambda u, lg=logits: lg[rows_of[u]], cfg)
            frontier = added[: cfg.beam]  # the best of them grow the next depth
            if not frontier or tree.n >= tree.limit or d == cfg.depth:
                break
            # the head over drafted nodes 1..n-1: row i-1 = (f^ of i's parent, token i) at depth(i)
            m = tree.n - 1
            for i in range(1, tree.n):
                self._tree_in[i - 1] = feat[tree.parents[i]]
                self._tree_par[i - 1] = tree.parents[i] - 1  # depth-1 nodes are the forest's roots
            logits = head.forward(
                tree.tokens[1 : tree.n], n - 1, features=self._tree_in[:m], parents=self._tree_par[:m]
            )
            hidden = head.last_hidden(m)
            for c in frontier:
                feat[c] = hidden[c - 1]
                rows_of[c] = c - 1

    def accepted(self, seq: SeqState, n_old: int, n_acc: int) -> None:
        # the speculative rows lie past dft_past already; a fused verify may have caught us up
        self._caught_up_by_target(seq, n_old - 1)


class EaglePlugin(ChainHeadPlugin):
    name = "eagle"
    order = 4
    summary = "an EAGLE head (one decoder layer) drafting from the target's own hidden states"
    section = EagleSection
    export_hint = "--eagle HEAD_DIR (the default model's export includes one)"
    trees = True
    options = (
        MIN_CONFIDENCE_OPTION,
        Option(
            "fuse_head",
            bool,
            True,
            "eagle/hybrid on the CPU (default on): verify with the folder's "
            "target+EAGLE graph, which runs the head inside the verify call, so under greedy decoding its "
            "first draft needs no head call of its own; --no-fuse-head: separate head calls (also used when "
            "the folder has no such graph)",
        ),
    )

    def build(self, ctx) -> EagleDrafter:
        e = ctx.engines.models["eagle"]
        verifier = e.fused if ctx.cfg.fuse_head else None
        return EagleDrafter(e.head, ctx.tgt_rows.features, ctx.target_vocab, ctx.cfg.eagle_min_confidence, verifier)

    def needs_features(self, cfg) -> bool:
        return True

    def load(self, manifest: Manifest, section: EagleSection, ctx) -> EagleEngines:
        from edgespec.engines.ort import OrtModel

        head = OrtModel(manifest, section.head, ctx.head_provider, ctx.threads)
        fused = None
        # the fused graph reads and writes both KV caches on the host
        if section.fused is not None and ctx.cfg.fuse_head and ctx.provider == ctx.head_provider == "cpu":
            from edgespec.runtime.drafters.eagle.fused import FusedVerifier

            fused = FusedVerifier(manifest, section.fused, head, ctx.threads, kv=ctx.target.kv)
        return EagleEngines(head, fused)

    def prime(self, engine: EagleEngines, widths, manifest: Manifest) -> None:
        engine.head.load_widths(widths)

    def tree_engines(self, engine: EagleEngines) -> tuple:
        return (engine.head,)


PLUGIN = register(EaglePlugin())
