"""A self-contained HTML report of a bench run: tables plus PNG plots embedded as data URIs."""

from __future__ import annotations

import base64
import html
import io

from edgespec.runtime.apps.bench_summary import format_table


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _label(r: dict) -> str:
    if r["drafter"] == "none":
        return "none"
    if r.get("tree"):
        return f"{r['drafter']} tree {r['tree']}"
    return f"{r['drafter']} k<={r['k']} adaptive" if r.get("adaptive") else f"{r['drafter']} k={r['k']}"


def plots(report: dict) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    out = {}
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [_label(r) for r in runs]
    vals = [r["totals"]["tokens_per_s"] for r in runs]
    bars = ax.bar(labels, vals, color=["#888"] + ["#2a7"] * (len(runs) - 1))
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput (higher is better)")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    out["tok/s"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for r in runs[1:]:
        acc = r["totals"].get("acceptance_by_position", [])
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=_label(r))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance by draft position")
    if len(runs) > 1:
        ax.legend(fontsize=7, ncol=2)
    out["acceptance"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for r in runs:
        h = r["totals"].get("itl_ms_histogram")
        if h:
            edges = h["edges"][:-1]
            total = max(sum(h["counts"]), 1)
            ax.step(edges, [c / total for c in h["counts"]], where="post", label=_label(r))
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("per-token latency (ms)")
    ax.set_ylabel("share of tokens")
    ax.set_title("Inter-token latency distribution")
    ax.legend(fontsize=7, ncol=2)
    out["itl"] = _png(fig)
    plt.close(fig)
    return out


def _md_table_to_html(md: str) -> str:
    lines = [line for line in md.splitlines() if line.startswith("|") and not line.startswith("|---")]
    rows = [[html.escape(c.strip()) for c in line.strip("|").split("|")] for line in lines]
    head = "".join(f"<th>{c}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_html(report: dict, path: str) -> None:
    cfg, mach = report["config"], report["machine"]
    imgs = plots(report)
    figs = "".join(f'<figure><img alt="{html.escape(k)}" src="{v}"></figure>' for k, v in imgs.items())
    meta = "".join(
        f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(v))}</li>"
        for k, v in list(cfg.items()) + list(mach.items())
    )
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgespec bench report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }} figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>edgespec bench</h1>
<p>Every configuration ran the same prompts, interleaved prompt by prompt, in one process. Mean accepted
length counts the target's own correction/bonus token; 1.0 means no gain.</p>
{_md_table_to_html(format_table(report))}
{figs}
<h2>Configuration and machine</h2><ul>{meta}</ul>
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)


def sweep_plot(report: dict, path: str) -> None:
    """tok/s and mean accepted length against k, one line per drafter, `none` as a reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["runs"] if not r.get("adaptive") and not r.get("tree")]
    base = next(r for r in runs if r["drafter"] == "none")["totals"]["tokens_per_s"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for d in dict.fromkeys(r["drafter"] for r in runs if r["drafter"] != "none"):
        pts = sorted((r["k"], r["totals"]) for r in runs if r["drafter"] == d)
        ks = [k for k, _ in pts]
        ax1.plot(ks, [t["tokens_per_s"] for _, t in pts], marker="o", label=d)
        ax2.plot(ks, [t["mean_accepted_length"] for _, t in pts], marker="o", label=d)
    ax1.axhline(base, color="#888", linestyle="--", label="none")
    ax1.set_xlabel("k (num_speculative_tokens)")
    ax1.set_ylabel("tokens / s")
    ax1.set_title("Throughput vs k")
    ax2.set_xlabel("k (num_speculative_tokens)")
    ax2.set_ylabel("tokens per target call")
    ax2.set_title("Mean accepted length (incl. bonus) vs k")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"{report['config']['engine']} - {report['config']['prompts']} - {report['machine']['cpu']}", fontsize=8
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
