"""Suffix decoding: the cache finds exactly the occurrences brute force finds, stays bounded,
persists, and drafts a repeated request from the earlier one (greedy identity and chi-square
tests of the drafter are in test_loop_fake.py and test_sampling.py)."""

import numpy as np
import pytest

from edgespec.engines.fake import FakeModel, random_table
from edgespec.runtime.backends import Engines
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.drafters.suffix import DEPTH, SEP, SuffixCache, SuffixConfig
from edgespec.runtime.generator import Generator


def _brute(tokens: np.ndarray, pattern: np.ndarray) -> list[int]:
    n = len(pattern)
    return sorted(i + n for i in range(len(tokens) - n) if (tokens[i : i + n] == pattern).all())


@pytest.mark.parametrize("vocab", [50, 70_000])  # 16-bit and 32-bit keys
def test_occurrences_match_brute_force_across_index_and_tail(vocab):
    rng = np.random.default_rng(0)
    cache = SuffixCache(SuffixConfig(tail_tokens=300), vocab_size=vocab)
    for _ in range(12):  # requests of a small alphabet (many repeats), some indexed, some in the tail
        cache.add(rng.integers(0, 5, rng.integers(20, 120)) + (vocab - 5 if vocab > 60_000 else 0))
    assert 0 < cache._n_sorted < len(cache)
    for n in (1, 2, 3, 5, DEPTH):
        for _ in range(20):
            start = rng.integers(0, len(cache) - n)
            pattern = cache.tokens[start : start + n]
            if (pattern == SEP).any():
                continue
            assert sorted(cache.occurrences(pattern).tolist()) == _brute(cache.tokens, pattern), (n, pattern)


def test_cache_stays_bounded_and_drops_whole_requests(tmp_path):
    cfg = SuffixConfig(max_tokens=500, tail_tokens=100, file=str(tmp_path / "cache.npy"))
    cache = SuffixCache(cfg, vocab_size=100)
    for i in range(40):
        cache.add(np.full(30, i % 90))
    assert len(cache) <= 500 and cache.tokens[-1] == SEP
    assert cache.tokens[0] != SEP and (cache.tokens[:30] == cache.tokens[0]).all()  # a whole request first
    cache.save()
    again = SuffixCache(cfg, vocab_size=100)
    assert np.array_equal(again.tokens, cache.tokens)
    assert sorted(again.occurrences(np.array([39 % 90, 39 % 90])).tolist()) == _brute(cache.tokens, np.array([39, 39]))


def test_a_repeated_request_is_drafted_from_the_earlier_one():
    table = random_table(64, seed=3)
    g = Generator(None, Engines(FakeModel(table, max_len=512)), RuntimeConfig(drafter="suffix", k=8, adaptive=False))
    prompt = np.array([3, 17, 5, 41, 8, 22, 9])
    first = [int(t) for c in g.generate_ids(prompt, 100) for t in c]
    g.forget()
    second = [int(t) for c in g.generate_ids(prompt, 100) for t in c]
    assert first == second
    assert g.last_stats.mean_accepted_length > 4.0  # the whole earlier answer is evidence
