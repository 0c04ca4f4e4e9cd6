"""Verification: which draft tokens the target keeps, greedy or lossless sampling.

Greedy: accept while draft[i] == argmax(p_i); then the target's own token (correction, or the
bonus token when every draft token was accepted). The output equals plain greedy decoding. Without a
repetition penalty only each row's argmax is read, so a greedy call can take the rows' argmax ids
instead of their logits (`accept_argmax`: an engine's top-k output, T ids back from a GPU instead of
T x V floats).

Sampling (Leviathan et al. 2023; Chen et al. 2023): draft token x_i ~ q_i is kept with
probability min(1, p_i(x) / q_i(x)); at the first rejection the replacement is drawn from
norm(max(0, p_i - q_i)), and if all are kept a bonus token is drawn from p_{m}. The accepted
sequence is then distributed exactly as the target's. Deterministic drafters (n-gram) have a
one-hot q, which makes the rule "keep x with probability p(x), else sample p with x zeroed".
p and q go through the same processing: repetition penalty (over the row's own context, draft
tokens before it included), temperature, top-k, top-p.

Trees (parents given): the same walk from the root, at each node over its children:
  greedy    take the target's argmax x at node u; move to u's child with token x, else x is the
            correction (or bonus) token. The output equals plain greedy decoding.
  sampling  try u's children in turn with p the target's processed distribution at u: a child
            with token x is kept with probability p(x) / sum(p); when rejected, p(x) is set to 0
            (renormalised implicitly by the division). If none is kept, the token is drawn from
            what is left of p. Children are deterministic candidates (one-hot q each), so this is
            sampling from p by successive rejection: lossless (SpecInfer's multi-candidate rule).

Seeded calls (sampling.KeyedDraws): each position's token is drawn from p by noise keyed to the seed
and the position alone (the exponential race), and a draft or child is kept iff it is that token. Every
token is an exact draw from p, and the output no longer depends on what was drafted: a seed fixes the
output whatever the drafter, its memory, k or the tree (a deterministic draft is kept with chance
p(x), as above).

Typical acceptance (Cai et al. 2024, arXiv 2401.10774) is offered as an explicit LOSSY option: a draft token
is kept when p(x) >= min(eps, sqrt(eps) * exp(-H(p))), so plausible tokens pass even where
p(x) / q(x) would reject them; the output no longer follows the target's distribution.
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.sampling import KeyedDraws, SamplingConfig, penalize, probs, row_dist, sample
from edgespec.runtime.state import Proposal, SeqState, SparseQ


def accept(
    prop: Proposal, tgt_logits: np.ndarray, seq: SeqState, sampling: SamplingConfig, rng: np.random.Generator
) -> tuple[int, int]:
    """(n accepted, the target's next token) for a proposal verified as tgt_logits [T, V]. The
    accepted drafts end up at seq.tokens[seq.n:seq.n + n accepted]; a tree's path in tree.path."""
    if prop.parents is not None:
        if sampling.greedy:
            return accept_tree_greedy(prop.tree, tgt_logits, seq.tokens, seq.n, sampling.repetition_penalty)
        return accept_tree_sampled(prop.tree, tgt_logits, sampling, rng, seq.tokens, seq.n)
    draft = prop.tokens[1:]
    if sampling.repetition_penalty != 1.0:  # row i's context: tokens[:n + i]
        tgt_logits = penalize(tgt_logits, seq.tokens, seq.n, sampling.repetition_penalty)
    if sampling.greedy:
        return accept_greedy(draft, tgt_logits)
    return accept_sampled(draft, prop.q, tgt_logits, sampling, rng)


def accept_argmax(prop: Proposal, tgt_ids: np.ndarray, seq: SeqState) -> tuple[int, int]:
    """accept() of a greedy call without a repetition penalty, from the verified rows' argmax ids [T]
    (each row's first maximum: an engine's argmax_rows) instead of their logits: the same result."""
    if prop.parents is not None:
        return accept_tree_greedy(prop.tree, None, seq.tokens, seq.n, tgt_ids=tgt_ids)
    return accept_greedy_ids(prop.tokens[1:], tgt_ids)


def accept_greedy(draft: np.ndarray, tgt_logits: np.ndarray) -> tuple[int, int]:
    """(n accepted, next token): draft [m], tgt_logits [m+1, V]."""
    return accept_greedy_ids(draft, tgt_logits.argmax(axis=-1))


def accept_greedy_ids(draft: np.ndarray, tgt_ids: np.ndarray) -> tuple[int, int]:
    """(n accepted, next token): draft [m], tgt_ids [m+1] the target's argmax of each row."""
    draft, tgt_ids = draft.tolist(), tgt_ids.tolist()  # (compared as ints: no numpy scalar per read)
    n = 0
    while n < len(draft) and draft[n] == tgt_ids[n]:
        n += 1
    return n, tgt_ids[n]


def accept_sampled(
    draft: np.ndarray,
    dft_probs: np.ndarray | SparseQ | None,
    tgt_logits: np.ndarray,
    cfg: SamplingConfig,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """(n accepted, next token) by rejection sampling; dft_probs [m, V], a SparseQ, or None (one-hot
    q). Only the rows the walk reaches are processed, one at a time (a row's distribution:
    sampling.RowDist)."""
    if cfg.typical_epsilon > 0:
        return accept_typical(draft, probs(tgt_logits, cfg), cfg.typical_epsilon, rng)
    if isinstance(rng, KeyedDraws):
        return _accept_keyed(draft, tgt_logits, cfg, rng)
    if isinstance(dft_probs, SparseQ):
        return _accept_sampled_sparse(draft, dft_probs, tgt_logits, cfg, rng)
    if dft_probs is not None:
        return _accept_sampled_q(draft, dft_probs, tgt_logits, cfg, rng)
    d = row_dist(tgt_logits.shape[-1])
    for i, x in enumerate(draft):
        d.load(tgt_logits[i], cfg)
        if rng.random() * d.total < d.w[x]:  # u < p(x), one-hot q(x) = 1
            continue
        d.remove(x)  # max(0, p - onehot(x)) is p with x zeroed
        if d.total <= 0.0:  # p was one-hot on x (rounding): any draw from p is right
            d.load(tgt_logits[i], cfg)
        return i, d.draw(rng)
    return len(draft), d.load(tgt_logits[len(draft)], cfg).draw(rng)


def _accept_keyed(draft: np.ndarray, tgt_logits: np.ndarray, cfg: SamplingConfig, rng: KeyedDraws) -> tuple[int, int]:
    """A seeded call (sampling.KeyedDraws): row i's token is position base + i's keyed draw from its
    processed distribution; a draft is kept iff it is that token, whatever its q (the first that is
    not is the step's last token). Each position's token is an exact draw from p given the kept prefix."""
    d = row_dist(tgt_logits.shape[-1])
    draft = draft.tolist()
    for i in range(len(draft) + 1):
        y = rng.pick(d.load(tgt_logits[i], cfg).w, i, d.blocks)
        if i == len(draft) or y != draft[i]:
            return i, y
    raise AssertionError("unreachable")


def _accept_sampled_q(
    draft: np.ndarray, dft_probs: np.ndarray, tgt_logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator
) -> tuple[int, int]:
    """accept_sampled with a drafter's distributions dft_probs [m, V]: p in float64 (the residual
    max(0, p - q) compares it with q entry by entry), per row reached."""
    for i, x in enumerate(draft):
        p = probs(tgt_logits[i], cfg)  # [V]
        q_x = dft_probs[i, x]
        if q_x > 0 and rng.random() * q_x < p[x]:  # u < p(x)/q(x), without dividing
            continue
        residual = np.subtract(p, dft_probs[i], out=p)
        np.maximum(residual, 0.0, out=residual)
        if residual.sum() <= 0.0:  # p == q exactly: any draw from p is right
            residual = probs(tgt_logits[i], cfg)
        return i, sample(residual, rng)
    return len(draft), row_dist(tgt_logits.shape[-1]).load(tgt_logits[len(draft)], cfg).draw(rng)


def _accept_sampled_sparse(
    draft: np.ndarray, q: SparseQ, tgt_logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator
) -> tuple[int, int]:
    """accept_sampled with draft distributions over a few tokens each: the same rule on RowDist's
    float32 weights (p = w / total), the residual max(0, p - q) written over q's few tokens only."""
    d = row_dist(tgt_logits.shape[-1])
    for i, x in enumerate(draft.tolist()):
        d.load(tgt_logits[i], cfg)
        ids, qs = q.ids[i].tolist(), q.probs[i].tolist()
        q_x = sum(p for t, p in zip(ids, qs, strict=True) if t == x)
        if q_x > 0.0 and rng.random() * q_x * d.total < d.w[x]:  # u < p(x) / q(x), without dividing
            continue
        d.subtract(ids, qs)
        if d.total <= 0.0:  # p <= q everywhere, i.e. p == q up to rounding: any draw from p is right
            d.load(tgt_logits[i], cfg)
        return i, d.draw(rng)
    return len(draft), d.load(tgt_logits[len(draft)], cfg).draw(rng)


def accept_typical(draft: np.ndarray, p: np.ndarray, eps: float, rng: np.random.Generator) -> tuple[int, int]:
    """LOSSY (opt-in): keep x_i while p_i(x_i) >= min(eps, sqrt(eps) * exp(-H(p_i))); the token after
    the kept ones is drawn from the target's p."""
    for i, x in enumerate(draft):
        row = p[i]
        nz = row[row > 0]
        entropy = float(-(nz * np.log(nz)).sum())
        if row[x] < min(eps, np.sqrt(eps) * np.exp(-entropy)):
            return i, sample(row, rng)
    return len(draft), sample(p[len(draft)], rng)


def accept_tree_greedy(
    tree,
    tgt_logits: np.ndarray | None,
    tokens: np.ndarray,
    n: int,
    repetition_penalty: float = 1.0,
    tgt_ids: np.ndarray | None = None,
) -> tuple[int, int]:
    """(n accepted, next token); tree.path[:n_acc+1] = the accepted nodes, root first, and their
    tokens are written at tokens[n:] (tokens[:n] is the context before them). tgt_ids [T]: the
    nodes' argmax ids in place of their logits (no repetition penalty then)."""
    cur, n_acc = 0, 0
    tree.path[0] = 0
    ids = tgt_ids.tolist() if tgt_ids is not None else None
    while True:
        x = ids[cur] if ids is not None else int(_row(tgt_logits, cur, tokens, n + n_acc, repetition_penalty).argmax())
        nxt = tree.child(cur, x)
        if nxt < 0:
            return n_acc, x
        cur, n_acc = nxt, _take(tree, nxt, tokens, n, n_acc)


def _row(tgt_logits: np.ndarray, node: int, tokens: np.ndarray, pos: int, penalty: float) -> np.ndarray:
    """Node's logits row, with the repetition penalty of its context tokens[:pos] applied."""
    row = tgt_logits[node]
    return penalize(row[None], tokens, pos, penalty)[0] if penalty != 1.0 else row


def _take(tree, node: int, tokens: np.ndarray, n: int, n_acc: int) -> int:
    """Keep `node` as the walk's next accepted node: its token at tokens[n + n_acc], itself on
    tree.path. Returns the new n_acc."""
    tokens[n + n_acc] = tree.tokens[node]
    tree.path[n_acc + 1] = node
    return n_acc + 1


def accept_tree_sampled(
    tree, tgt_logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator, tokens: np.ndarray, n: int
) -> tuple[int, int]:
    """Lossless tree acceptance (module docstring). tokens[:n] is the context before the root's
    successor; accepted tokens are written at tokens[n:] as the walk goes (the repetition
    penalty of a row sees its own path). Only the nodes on the walk are processed."""
    d = row_dist(tgt_logits.shape[-1])
    cur, n_acc = 0, 0
    tree.path[0] = 0
    while True:
        row = _row(tgt_logits, cur, tokens, n + n_acc, cfg.repetition_penalty)
        d.load(row, cfg)
        if isinstance(rng, KeyedDraws):  # the position's keyed draw; its child, if drafted, is kept
            y = rng.pick(d.w, n_acc, d.blocks)
            kept = tree.child(cur, y)
            if kept < 0:
                return n_acc, y
        else:
            kept = -1
            for c in range(cur + 1, tree.n):
                if tree.parents[c] != cur:
                    continue
                x = tree.tokens[c]
                if rng.random() * d.total < d.w[x]:  # u < p(x) / what is left of p
                    kept = c
                    break
                d.remove(x)
            if kept < 0:
                if d.total <= 0.0:  # every token with mass was a rejected child (rounding)
                    d.load(row, cfg)
                return n_acc, d.draw(rng)
        cur, n_acc = kept, _take(tree, kept, tokens, n, n_acc)
