"""Row checks of exported targets: tree rows against chain rows, two engines' logits over one call schedule."""

import numpy as np

MAX_LEN = 128  # the context of the folders call_schedule is written for (it runs to their end)


def random_tree(rng, path: np.ndarray, n_nodes: int, vocab: int, n_chain: int = 1):
    """(tokens, parents, path node ids): a tree in topological order that holds `path` as one
    root-to-leaf branch (root = path[0]), the other nodes random tokens under random parents;
    its first n_chain nodes are path nodes (a chain)."""
    tokens, parents, depth = [int(path[0])], [-1], [0]
    on_path = [0]
    for t in path[1:n_chain]:
        parents.append(on_path[-1])
        tokens.append(int(t))
        on_path.append(len(tokens) - 1)
        depth.append(len(on_path) - 1)
    while len(tokens) < n_nodes:
        d_next = len(on_path)
        if d_next < len(path) and rng.random() < 0.4:  # extend the true path
            parents.append(on_path[-1])
            tokens.append(int(path[d_next]))
            on_path.append(len(tokens) - 1)
        else:
            p = int(rng.integers(len(tokens)))
            parents.append(p)
            tokens.append(int(rng.integers(3, vocab)))
        depth.append(depth[parents[-1]] + 1)
    while len(on_path) < len(path):  # finish the path if the random draw did not
        parents.append(on_path[-1])
        tokens.append(int(path[len(on_path)]))
        on_path.append(len(tokens) - 1)
    return np.array(tokens, np.int64), np.array(parents, np.int64), np.array(on_path, np.int64)


def assert_tree_rows_are_chain_rows(e, pasts, n_nodes: int, label: str = "") -> None:
    """Engine e: after a random prefill of each past, the rows of a random tree of n_nodes that holds a
    4-token path equal, bitwise, the one-token decodes of that path."""
    from edgespec.runtime.prefill import prefill
    from edgespec.runtime.tree import tree_chain_prefix

    for past in pasts:
        rng = np.random.default_rng(past)
        seq = rng.integers(3, 256, past + 6).astype(np.int64)
        prefill(e, seq[:past], 0)
        ref = []
        for i, t in enumerate(seq[past : past + 4]):
            ref.append(e.forward(np.array([t]), past + i)[0].copy())
            e.commit(past + i, 1)
        tokens, parents, on_path = random_tree(rng, seq[past : past + 4], n_nodes, 256, tree_chain_prefix(past, 4))
        logits = e.forward(tokens, past, parents=parents)
        for d, node in enumerate(on_path):
            assert np.array_equal(logits[node], ref[d]), (label, past, d)


def call_schedule():
    """(past_len, tokens, parents) of a call schedule: prefill chunks, chain and tree verifies, decodes,
    and calls at the end of the context whose padding rows run past max_len. Each call commits
    all its rows when `commit` says so."""
    rng = np.random.default_rng(5)
    toks = rng.integers(0, 256, MAX_LEN + 8)
    yield 0, toks[:16], None, True
    for w in (2, 3, 4):
        yield 16, toks[16 : 16 + w], None, False
    yield 16, toks[16:20], np.array([-1, 0, 0, 1]), False
    yield 16, toks[16:20], np.array([-1, 0, 1, 1]), False
    for past in range(16, 24):
        yield past, toks[past : past + 1], None, True
    for past in range(24, 120, 16):
        yield past, toks[past : past + 16], None, True
    yield 120, toks[120:124], None, True
    yield 124, toks[124:127], None, False  # width 4: one padding row at slot 127
    yield 124, toks[124:126], np.array([-1, 0]), False  # width 2 tree
    yield 124, toks[124:125], None, True
    yield 125, toks[125:128], np.array([-1, 0, 0]), False  # width 4: the padding row's slot is max_len
    yield 125, toks[125:126], None, True
    yield 126, toks[126:127], None, True
    yield 127, toks[127:128], None, False


def assert_same_logits_over_calls(plain, host, label) -> None:
    """The in-graph-prologue engine and the --host-prologue one give the same logits bits on every
    call of call_schedule that the host engine can take (its widths; trees where its graph takes them)."""
    for past, ids, parents, commit in call_schedule():
        if (parents is not None and not host.takes_tree) or len(ids) > max(host.widths):
            continue
        want = plain.forward(ids, past, parents=parents).copy()
        got = host.forward(ids, past, parents=parents)
        assert np.array_equal(got, want), (label, past, len(ids), parents, np.abs(got - want).max())
        if commit:
            plain.commit(past, len(ids))
            host.commit(past, len(ids))
