"""Host time per step of the recycle table's update (the drafter's observe hooks: the verify call's
rows, then its committed rows) and of drafting (Generator._draft: propose / propose_tree and the
budget's cut), on a folder over a few prompts, greedy, 128 new tokens. Timings: run it on a quiet
machine (numbers taken beside other work are rough).

    python tools/recycle_host_time.py FOLDER PROMPTS.jsonl [N_PROMPTS] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgespec.runtime.apps.bench import load_prompts
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.generator import Generator
from edgespec.runtime.tree import TreeConfig

SETTINGS = (  # (drafter, tree, adaptive, extra RuntimeConfig fields)
    ("recycle", "", False, {}),
    ("recycle", "9:4:2:2", True, {}),
    ("merged", "9:4:2:2", True, {}),
    ("merged", "9:4:2:2", False, {}),
    ("merged", "9:4:2:2", True, {"merged_lookup": "ngram"}),
    ("recycle", "9:6:8:1", False, {}),
)


class Timer:
    """Wraps a callable, summing its seconds and calls."""

    def __init__(self, fn) -> None:
        self.fn, self.s, self.n = fn, 0.0, 0

    def __call__(self, *a, **kw):
        t = time.perf_counter()
        out = self.fn(*a, **kw)
        self.s += time.perf_counter() - t
        self.n += 1
        return out

    def ms(self, per: int | None = None) -> float:
        return self.s * 1e3 / max(per or self.n, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("prompts")
    ap.add_argument("n", nargs="?", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--extra", default="", help="RuntimeConfig fields for every setting, e.g. recycle_every_row=1")
    a = ap.parse_args()
    rows = load_prompts(a.prompts, a.n)
    extra = {}
    for kv in filter(None, a.extra.split(",")):
        key, value = kv.split("=", 1)
        default = RuntimeConfig.__dataclass_fields__[key].default
        extra[key] = type(default)(value) if default is not None else value  # (typed as the field's default)
    for drafter, tree, adaptive, more in SETTINGS:
        tcfg = TreeConfig.parse(tree) if tree else TreeConfig()
        cfg = RuntimeConfig(drafter=drafter, k=8, adaptive=adaptive, tree=tcfg, threads=a.threads, **more, **extra)
        g = Generator.load(a.folder, cfg)
        d = g.drafter
        obs, acc, draft = Timer(d.observe), Timer(d.accepted), Timer(g._draft)
        d.observe, d.accepted, g._draft = obs, acc, draft
        widths, tpc = [], []
        for r in rows:
            ids = g.codec.encode(r.get("messages", r.get("prompt")))
            for _ in g.generate_ids(ids, 128):
                pass
            st = g.last_stats
            widths.append(1 + st.n_drafted / max(st.n_target_calls, 1))
            tpc.append(st.mean_accepted_length)
        t = d.recycle_table
        label = f"{drafter} {'tree ' + tree if tree else 'chain k<=8'}{' adaptive' if adaptive else ''}"
        label += "".join(f" {k}={v}" for k, v in more.items())
        print(
            f"{label}: update {(obs.s + acc.s) * 1e3 / max(obs.n, 1):.3f} ms/step (observe "
            f"{obs.ms():.3f} + accepted {acc.ms(obs.n):.3f}: committed rows, merged's calibration), "
            f"draft {draft.ms():.3f} ms/step over {draft.n} steps; "
            f"width {np.mean(widths):.2f}, tokens/call {np.mean(tpc):.2f}; table {t.nbytes / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()
