"""Lossless-sampling checks on fake engines: the exact distribution of the 2nd and 3rd tokens, samples
of them, and a chi-square test between the two."""

import numpy as np

from edgespec.engines.fake import FakeEagleHead, FakeHeads, FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters.eagle import EagleEngines
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig, probs
from edgespec.runtime.tree import TreeConfig

V = 8  # small vocabulary: exact target distributions of the first tokens are cheap to enumerate
PROMPT = np.array([1, 2, 3, 1, 2])
N_SAMPLES = 3000
CFG = SamplingConfig(temperature=1.0)
TREE = TreeConfig(nodes=7, depth=3, branch=3, beam=2)


def fake_generator(drafter: str, tree: TreeConfig = TreeConfig()) -> Generator:
    """A Generator on fake engines of vocabulary V: target, draft model, EAGLE head, Medusa heads."""
    table = random_table(V, seed=11, sharpness=1.0)
    target = FakeModel(table, max_len=64)
    draft = FakeModel(table + np.random.default_rng(2).standard_normal(table.shape).astype(np.float32), max_len=64)
    head = FakeEagleHead(V, d2t=[0, 2, 3, 5, 6], max_len=64)  # a reduced draft vocabulary: q = 0 elsewhere
    heads = FakeHeads(V, d2t=[0, 1, 3, 4, 6, 7], n_heads=3)
    return Generator(
        None,
        Engines(target, {"draft": draft, "eagle": EagleEngines(head, None), "medusa": heads}),
        RuntimeConfig(drafter=drafter, k=3, tree=tree, eagle_min_confidence=0.0, medusa_min_confidence=0.0),
    )


def exact_tokens_23(g: Generator, cfg: SamplingConfig = CFG) -> np.ndarray:
    """The target's exact joint distribution of the 2nd and 3rd generated tokens after PROMPT."""
    t = g.target

    def nxt(cur, prev, ctx=()):
        logits = t.table[cur] + t.table2[prev]
        if cfg.repetition_penalty != 1.0:
            seen = np.unique(np.concatenate([PROMPT, np.array(ctx, np.int64)]))
            logits = logits.copy()
            logits[seen] = np.where(
                logits[seen] > 0, logits[seen] / cfg.repetition_penalty, logits[seen] * cfg.repetition_penalty
            )
        return probs(logits, cfg)

    p1 = nxt(PROMPT[-1], PROMPT[-2])
    dist = np.zeros((V, V))
    for a in range(V):
        p2 = nxt(a, PROMPT[-1], [a])
        for b in range(V):
            dist[b] += p1[a] * p2[b] * nxt(b, a, [a, b])
    return dist  # [token2, token3]


def chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Chi-square p-value of counts against a distribution (rare cells pooled)."""
    from scipy.stats import chisquare

    exp = expected_p.ravel() * counts.sum()
    obs = counts.ravel()
    keep = exp > 5  # pool rare cells
    obs_k = np.append(obs[keep], obs[~keep].sum())
    exp_k = np.append(exp[keep], exp[~keep].sum())
    if exp_k[-1] == 0:
        obs_k, exp_k = obs_k[:-1], exp_k[:-1]
    return float(chisquare(obs_k, exp_k).pvalue)


def sample_counts(g: Generator, cfg: SamplingConfig = CFG) -> np.ndarray:
    """Counts of (2nd, 3rd) generated tokens over N_SAMPLES unseeded calls."""
    counts = np.zeros((V, V))
    for s in range(N_SAMPLES):
        # an unseeded call drawing from rng: the rejection rule (a seed would key the draws by position)
        rng = np.random.default_rng(s)
        out = np.concatenate([c.copy() for c in g.generate_ids(PROMPT, 3, cfg, rng=rng)])
        counts[out[1], out[2]] += 1
    return counts


class AuxTarget:
    """A fake target whose hidden_aux rows are its logits, twice (two 'layers')."""

    def __new__(cls, table, max_len):
        class Target(FakeModel):
            def last_hidden_aux(self, n):
                self._aux[:n, : self.vocab_size] = self._logits[:n]
                self._aux[:n, self.vocab_size :] = -self._logits[:n]
                return self._aux[:n]

        t = Target(table, max_len=max_len)
        t._aux = np.zeros((max(t.widths), 2 * t.vocab_size), np.float32)
        return t
