"""Host time per step of the greedy speculative loop, with the target's model call replayed.

    python tools/host_step_replay.py FOLDER N_PROMPTS SPECS [--repeat 5] [--profile SPEC]

SPECS as /work/scratch/s3/steps.py takes them: `none,recycle:4,merged:4,merged:8@6:3:2:2`
(drafter:k[@tree]; adaptive settings are refused: their choices follow measured call times, so a
replay would not take the recorded path). Each setting first runs the first N_PROMPTS prompts of
tools/prompts/drafts_eval.jsonl for real (greedy, 128 new tokens), recording what every target call
returned (its rows' top-k ids and probabilities, the ids the loop reads); then it runs them again
`--repeat` times from the same start (a fresh drafter store: the folder's warm table, an empty
suffix cache) with the session's run replaced by a copy of the recorded outputs into the bound
buffers. Everything else the loop does runs as it does for real (the engine's input prep, binding
lookup, commit of the K/V rows, the drafter's hooks, acceptance, stats), so the decode-phase time per
step of a replay is the loop's host time per step, free of the model call's noise. The replayed
calls' inputs are checked against the recorded ones (a replay that left the recorded path is an
error). Prints per setting: steps, tokens per call, and per step the host time (best of the
repeats, and median) split as draft / verify call without the model / rest. --profile SPEC: one
more replay of that setting under cProfile, its top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import pstats
import statistics
import time
from pathlib import Path

import numpy as np

from edgespec.engines.ort import share_thread_pool
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.constraint import NO_CONSTRAINT
from edgespec.runtime.drafters import recycle
from edgespec.runtime.generator import Generator
from edgespec.runtime.sampling import SamplingConfig
from edgespec.runtime.state import SeqState
from edgespec.runtime.tree import TreeConfig

PROMPTS = Path(__file__).parent / "prompts" / "drafts_eval.jsonl"


class Recorder:
    """Stands in for an engine's session: runs the real one and keeps each call's outputs."""

    def __init__(self, engine, session) -> None:
        self.engine, self.session, self.calls = engine, session, []
        self.prefilling = False  # set while the generator prefills (wrap_prefill)

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding) -> None:
        self.session.run_with_iobinding(binding)
        e = self.engine
        w = next(key[0] for key, b in e._bindings.items() if b is binding)
        logits = e._logits[w].copy() if self.prefilling else None  # (a prefill's last row gives the first token)
        self.calls.append((w, e._ids[w].copy(), e._topk_ids[w].copy(), e._topk_probs[w].copy(), logits))


class Replayer:
    """Stands in for an engine's session: copies the recorded outputs of the next call."""

    def __init__(self, engine, session, calls, evict: np.ndarray | None = None) -> None:
        self.engine, self.session, self.calls, self.i = engine, session, calls, 0
        self.evict = evict  # a buffer read and written in each call, as the model call sweeps the caches
        self.run_s = 0.0  # seconds in the replayed runs (the forward pieces less these: its host side)
        self.prefilling = False
        self.seen: list[np.ndarray] = []

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding) -> None:
        t0 = time.perf_counter()
        w, ids, top_ids, top_probs, logits = self.calls[self.i]
        e = self.engine
        self.seen.append(e._ids[w].copy())  # (checked after the timed run: the same call, the same inputs?)
        e._topk_ids[w][:] = top_ids
        e._topk_probs[w][:] = top_probs
        if logits is not None:
            e._logits[w][:] = logits
        if self.evict is not None:
            self.evict += 1
        self.i += 1
        self.run_s += time.perf_counter() - t0


def wrap_prefill(g: Generator, stand_in) -> None:
    """Mark the target calls of g's prefills on stand_in (their logits are read)."""
    orig = type(g)._prefill

    def _prefill(*args, **kw):
        stand_in.prefilling = True
        try:
            return orig(g, *args, **kw)
        finally:
            stand_in.prefilling = False

    g._prefill = _prefill


class Pieces:
    """perf_counter sums around the loop's host pieces (wrapped on the generator, drafter, engine)."""

    # forward: the verify call's host side (the replayed run's own time taken off)
    NAMES = ("lookup", "grow", "forward", "observe", "accept", "commit", "keep", "advance", "accepted", "emit")

    def __init__(self) -> None:
        self.s = dict.fromkeys(self.NAMES, 0.0)

    def wrap(self, name: str, fn):
        s = self.s

        def timed(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            s[name] += time.perf_counter() - t
            return out

        return timed

    def install(self, g: Generator) -> None:
        eng, d, nc = g.target, g.drafter, NO_CONSTRAINT
        eng.forward, eng.commit = self.wrap("forward", eng.forward), self.wrap("commit", eng.commit)
        d.observe, d.accepted = self.wrap("observe", d.observe), self.wrap("accepted", d.accepted)
        nc.accept_argmax = self.wrap("accept", type(nc).accept_argmax.__get__(nc))
        g.tgt_rows.keep, g._emit = self.wrap("keep", g.tgt_rows.keep), self.wrap("emit", g._emit)
        SeqState.advance = self.wrap("advance", _ADVANCE)
        recycle.grow = self.wrap("grow", _GROW)  # (merged's and recycle's trees)
        lookup = getattr(d, "lookup", None)  # merged's suffix / prompt lookup, drafted first
        if lookup is not None:
            lookup.propose, lookup.propose_tree = (
                self.wrap("lookup", lookup.propose),
                self.wrap("lookup", lookup.propose_tree),
            )

    @staticmethod
    def remove(g: Generator) -> None:
        del g.target.forward, g.target.commit, g.tgt_rows.keep, g._emit, NO_CONSTRAINT.accept_argmax
        SeqState.advance, recycle.grow = _ADVANCE, _GROW

    @staticmethod
    def best(runs: list[Pieces], steps: int) -> str:
        return " ".join(f"{k} {min(p.s[k] for p in runs) * 1e3 / steps:.3f}" for k in Pieces.NAMES)


_ADVANCE, _GROW = SeqState.advance, recycle.grow


def configure(g: Generator, spec: str) -> None:
    spec_, tree = spec.split("@") if "@" in spec else (spec, "")
    parts = spec_.split(":")
    if "adaptive" in parts:
        raise SystemExit(f"{spec}: adaptive settings follow measured call times; a replay cannot follow them")
    g.drafter_store = {}
    k = int(parts[1]) if len(parts) > 1 else None
    g.reconfigure(drafter=parts[0], k=k, adaptive=False, tree=TreeConfig.parse(tree) if tree else TreeConfig())
    g.forget()


def run(g: Generator, encs) -> dict:
    tot = dict(total=0.0, ttft=0.0, draft=0.0, verify=0.0, steps=0, out=0)
    outs = []
    for ids in encs:
        for _ in g.generate_ids(ids, 128, SamplingConfig(temperature=0.0)):
            pass
        st = g.last_stats
        tot["total"] += st.total_s
        tot["ttft"] += st.ttft_s
        tot["draft"] += st.draft_s
        tot["verify"] += st.verify_s
        tot["steps"] += st.n_target_calls
        tot["out"] += st.n_output
        outs.append(g.last_output_ids())
    tot["outs"] = outs
    return tot


def per_step(t: dict) -> tuple[float, float, float, float]:
    """(host, draft, verify call, rest) ms per step of a run's decode phase."""
    ns = max(t["steps"], 1)
    dec = t["total"] - t["ttft"]
    return dec * 1e3 / ns, t["draft"] * 1e3 / ns, t["verify"] * 1e3 / ns, (dec - t["draft"] - t["verify"]) * 1e3 / ns


def summary(times: list[tuple[float, float, float, float]]) -> str:
    best = [min(x[i] for x in times) for i in range(4)]  # (each part's best: loads come and go)
    med = [statistics.median(x[i] for x in times) for i in range(4)]
    return (
        f"per step (ms, best / median of {len(times)}): draft {best[1]:.3f} / {med[1]:.3f}, rest {best[3]:.3f} / "
        f"{med[3]:.3f}; verify call without the model {best[2]:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("n", type=int)
    ap.add_argument("specs")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", default="")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--before",
        default="",
        help="a .py file with install(g) / remove(g) that put the code before a change back: each repeat "
        "then runs before and after, interleaved",
    )
    ap.add_argument("--pieces", action="store_true", help="time the host pieces too (wrapped: each adds ~1 us a call)")
    ap.add_argument(
        "--evict", type=int, default=0, help="MiB each replayed call sweeps (the model call's cache misses)"
    )
    a = ap.parse_args()
    share_thread_pool()
    prompts = [json.loads(line) for line in open(PROMPTS)][: a.n]
    g = Generator.load(a.folder, RuntimeConfig(drafter="none"))
    encs = [g.codec.encode(p.get("messages") or p["prompt"]) for p in prompts]
    tgt = g.engines.target
    real = tgt.session()
    plain = None
    evict = np.zeros(a.evict << 18, np.float32) if a.evict else None
    patch = None
    if a.before:
        spec_ = importlib.util.spec_from_file_location("before", a.before)
        patch = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(patch)
    for spec in a.specs.split(","):
        configure(g, spec)
        eng = g.target
        if eng is not tgt:
            raise SystemExit(f"{spec}: verifies with another engine than the plain target; not replayed here")
        rec = Recorder(eng, real)
        eng._session = rec
        wrap_prefill(g, rec)
        recorded = run(g, encs)
        if plain is None and spec.split(":")[0] == "none":
            plain = recorded["outs"]
        same = ""
        if plain is not None:
            n_same = sum(np.array_equal(x, y) for x, y in zip(recorded["outs"], plain, strict=True))
            same = f", {n_same}/{len(encs)} = plain"
        times, before = [], []
        pieces: dict[bool, list[Pieces]] = {False: [], True: []}
        variants = [False] * (a.repeat + (spec == a.profile))
        if patch is not None:  # before / after, interleaved (a load that comes and goes hits both)
            variants = [v for _ in range(a.repeat) for v in (True, False)]
        for r, old in enumerate(variants):
            configure(g, spec)
            if old:
                patch.install(g)
            prof = cProfile.Profile() if spec == a.profile and r == a.repeat else None
            if a.pieces and prof is None:
                pieces[old].append(Pieces())
                pieces[old][-1].install(g)
            rep = Replayer(eng, real, rec.calls, evict)
            eng._session = rep
            wrap_prefill(g, rep)
            if prof:
                prof.enable()
            t = run(g, encs)
            if prof:
                prof.disable()
            if old:
                patch.remove(g)
            if rep.i != len(rec.calls) or any(not np.array_equal(rep.seen[j], rec.calls[j][1]) for j in range(rep.i)):
                raise SystemExit(f"{spec}: the replay left the recorded path")
            if not all(np.array_equal(x, y) for x, y in zip(t["outs"], recorded["outs"], strict=True)):
                raise SystemExit(f"{spec}: the replay's output differs from the recorded run's")
            if prof:
                pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
                continue
            if a.pieces:
                Pieces.remove(g)
                pieces[old][-1].s["forward"] -= rep.run_s
            (before if old else times).append(per_step(t))
        eng._session = real
        del g._prefill
        ns = recorded["steps"]
        if before:
            print(f"{spec:22} BEFORE ({a.before}): {summary(before)}")
            if a.pieces:
                print(f"{'':22} BEFORE pieces per step (ms, best): {Pieces.best(pieces[True], ns)}")
        print(
            f"{spec:22} steps {ns} tok/call {(recorded['out'] - len(encs)) / ns:.2f}{same} | {summary(times)}",
            flush=True,
        )
        if a.pieces:
            print(f"{'':22} pieces per step (ms, best): {Pieces.best(pieces[False], ns)}", flush=True)


if __name__ == "__main__":
    main()
