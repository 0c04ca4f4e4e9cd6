"""Generation metrics, printed the same way every run and available as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_POSITIONS = 64


@dataclass
class GenerationStats:
    drafter: str = "none"
    k: int = 0  # num_speculative_tokens (the maximum when adaptive)
    adaptive: bool = False  # k chosen per step by runtime/adaptive.py
    tree: str = ""  # token-tree spec NODES:DEPTH:BRANCH:BEAM when trees were drafted
    n_prompt: int = 0  # prompt tokens
    n_prompt_cached: int = 0  # prompt tokens whose KV rows were reused from the previous call
    n_output: int = 0  # generated tokens (emitted)
    ttft_s: float = 0.0  # call start -> first token
    total_s: float = 0.0  # call start -> last token
    prefill_s: float = 0.0  # target (+ draft) prompt processing
    draft_s: float = 0.0  # time in drafter.propose
    verify_s: float = 0.0  # time in target verify/decode calls
    n_target_calls: int = 0  # verify/decode calls after prefill
    n_draft_calls: int = 0  # draft model forward calls (0 for model-free drafters)
    n_drafted: int = 0  # tokens proposed
    n_accepted: int = 0  # proposed tokens the target kept
    n_step_tokens: int = 0  # tokens produced by verify steps (accepted + correction/bonus)
    finish_reason: str = ""  # "stop" (EOS / stop string) | "length"
    drafted_at: np.ndarray = field(default_factory=lambda: np.zeros(MAX_POSITIONS, np.int64))
    accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(MAX_POSITIONS, np.int64))
    itl_s: list = field(default_factory=list)  # per-token latency: step time / tokens of the step
    sources: dict = field(default_factory=dict)  # hybrid: source -> [steps it drafted, drafted, accepted]
    grammar: str = ""  # what constrained the output: json_schema | json_object | lark | regex ("": nothing)
    n_forced: int = 0  # tokens the grammar forced: no target choice (they still rode in a verify call for KV)
    n_grammar_cut: int = 0  # drafts dropped before verify: forbidden by the grammar, or past a missed forced token
    n_masks: int = 0  # token masks the grammar computed
    n_forced_rows: int = 0  # forced tokens that rode in verify calls (rows beside the drafts)
    grammar_s: float = 0.0  # host time in the grammar during steps (masks, forced tokens, matcher, masked accept)

    def record_step(
        self, m: int, n_acc: int, n_emitted: int, step_s: float, n_proposed: int | None = None, n_forced: int = 0
    ) -> None:
        """m: draft length (a tree: its depth, so per-position counts are per depth);
        n_proposed: tokens drafted (a tree: its nodes below the root; default m); n_forced: a
        grammar's forced tokens kept before the step's last token (step tokens, not drafts)."""
        self.n_target_calls += 1
        self.n_drafted += m if n_proposed is None else n_proposed
        self.n_accepted += n_acc
        self.n_step_tokens += n_acc + 1 + n_forced
        self.drafted_at[:m] += 1
        self.accepted_at[:n_acc] += 1
        if n_emitted:
            self.itl_s.extend([step_s / n_emitted] * n_emitted)

    def record_source(self, source: str, n_drafted: int, n_acc: int) -> None:
        """Which of a hybrid's drafters made this step's proposal."""
        s = self.sources.setdefault(source, [0, 0, 0])
        s[0] += 1
        s[1] += n_drafted
        s[2] += n_acc

    def record_grammar(self, con) -> None:
        """A constrained call's grammar counters (a constrain.Constraint after the call)."""
        self.n_forced, self.n_grammar_cut, self.n_masks = con.n_forced, con.n_cut, con.n_masks
        self.n_forced_rows, self.grammar_s = con.n_forced_rows, con.seconds

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target verify call, the correction/bonus token included (1.0 = no gain)."""
        return self.n_step_tokens / self.n_target_calls if self.n_target_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_output / self.total_s if self.total_s > 0 else 0.0

    def itl_ms(self) -> dict:
        if not self.itl_s:
            return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
        a = np.array(self.itl_s) * 1e3
        return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}

    def acceptance_by_position(self) -> list[float]:
        n = int(np.count_nonzero(self.drafted_at))
        return [float(self.accepted_at[i] / self.drafted_at[i]) for i in range(n)]

    def to_dict(self) -> dict:
        host = max(0.0, self.total_s - self.prefill_s - self.draft_s - self.verify_s - self.grammar_s)
        return {
            "drafter": self.drafter,
            "k": self.k,
            "adaptive": self.adaptive,
            "tree": self.tree,
            "prompt_tokens": self.n_prompt,
            "prompt_tokens_cached": self.n_prompt_cached,
            "tokens": self.n_output,
            "seconds": self.total_s,
            "tokens_per_s": self.tokens_per_s,
            "ttft_ms": self.ttft_s * 1e3,
            "itl_ms": self.itl_ms(),
            "target_calls": self.n_target_calls,
            "draft_calls": self.n_draft_calls,
            "drafted": int(self.n_drafted),
            "accepted": int(self.n_accepted),
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_by_position": self.acceptance_by_position(),
            "time_split_s": {
                "prefill": self.prefill_s,
                "draft": self.draft_s,
                "verify": self.verify_s,
                "host": host,
                "grammar": self.grammar_s,
            },
            "finish_reason": self.finish_reason,
            "grammar": self.grammar or None,
            "forced_tokens": self.n_forced,
            "grammar_cut": self.n_grammar_cut,
            "grammar_masks": self.n_masks,
            "forced_rows": self.n_forced_rows,
            "grammar_ms_per_step": self.grammar_s * 1e3 / self.n_target_calls if self.n_target_calls else 0.0,
            "draft_sources": {k: {"steps": v[0], "drafted": v[1], "accepted": v[2]} for k, v in self.sources.items()},
        }

    def line(self) -> str:
        d = self.to_dict()
        t = d["time_split_s"]
        tot = max(self.total_s, 1e-9)
        ad = " adaptive" if self.adaptive else ""
        shape = f"tree {self.tree}" if self.tree else f"k={self.k}{ad}"
        src = "".join(f" {k} {v[0]}" for k, v in self.sources.items())
        return (
            f"[{self.drafter} {shape}] {self.n_output} tok in {self.total_s:.2f}s = "
            f"{self.tokens_per_s:.1f} tok/s | TTFT {d['ttft_ms']:.0f} ms | ITL p50 {d['itl_ms']['p50']:.1f} "
            f"p95 {d['itl_ms']['p95']:.1f} p99 {d['itl_ms']['p99']:.1f} ms | "
            f"accepted {self.n_accepted}/{self.n_drafted} ({self.acceptance_rate:.0%}) | "
            f"mean accepted length {self.mean_accepted_length:.2f} (incl. bonus) | "
            + (f"steps by source{src} | " if src else "")
            + (
                f"grammar {self.grammar}: forced {self.n_forced} cut {self.n_grammar_cut} "
                f"{d['grammar_ms_per_step']:.2f} ms/step | "
                if self.grammar
                else ""
            )
            + f"calls tgt {self.n_target_calls} dft {self.n_draft_calls} | time prefill "
            f"{t['prefill'] / tot:.0%} draft {t['draft'] / tot:.0%} verify {t['verify'] / tot:.0%} "
            f"host {t['host'] / tot:.0%}"
        )
