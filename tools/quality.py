"""How faithful is a quantized folder to its fp32 export: top-1 agreement and perplexity.

Every folder's target runs teacher-forced over the same held-out text (windows of the folder's
context, prefill-chunk calls), and each position's logits are compared with the reference
folder's: top-1 agreement (the share of positions where both pick the same next token; greedy
decoding follows the argmax, so this is what decides whether outputs diverge), the mean KL of the
reference's distribution to the folder's, and each folder's perplexity on the text itself.

    python tools/quality.py --reference engines/fp32 engines/int4 engines/int8 --text FILE [FILE ...]

Use text that no training prompt or eval came from (the default: the Apache-2.0 licence text and
a Python standard-library module, as found on this machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

DEFAULT_TEXTS = ("/usr/share/common-licenses/Apache-2.0", "textwrap.py")  # the second: found in the stdlib


def _default_texts() -> list[Path]:
    import sysconfig

    out = [Path(DEFAULT_TEXTS[0])] if Path(DEFAULT_TEXTS[0]).exists() else []
    return out + [Path(sysconfig.get_paths()["stdlib"]) / DEFAULT_TEXTS[1]]


def teacher_forced_logprobs(folder: str, ids: np.ndarray, keep_full: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(log p(next token) at each position [n-1], the full log-softmax rows [n-1, V] if keep_full)."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel

    m = load_manifest(folder)
    eng = OrtModel(m, m.target)
    chunk, window = m.prefill_chunk, m.max_len - 1
    lp_next, full = [], []
    for w0 in range(0, len(ids) - 1, window):
        seg = ids[w0 : w0 + window + 1]
        past = 0
        rows = []
        while past < len(seg) - 1:
            n = min(chunk, len(seg) - 1 - past)
            logits = eng.forward(seg[past : past + n], past)[:n].astype(np.float64)  # [n, V]
            eng.commit(past, n)
            past += n
            z = logits - logits.max(axis=1, keepdims=True)
            rows.append(z - np.log(np.exp(z).sum(axis=1, keepdims=True)))
        lsm = np.concatenate(rows)  # [len(seg)-1, V]
        lp_next.append(lsm[np.arange(len(lsm)), seg[1:]])
        if keep_full:
            full.append(lsm.astype(np.float32))
    return np.concatenate(lp_next), (np.concatenate(full) if keep_full else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("folders", nargs="+", help="engine folders to measure")
    p.add_argument("--reference", required=True, help="the folder the others are compared with (an fp32 export)")
    p.add_argument("--text", nargs="*", help="held-out text files (default: the licence text and a stdlib module)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens of text used (default 4096)")
    p.add_argument("--json", help="also write the table as JSON here")
    a = p.parse_args(argv)
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.text import TextCodec

    texts = [Path(t) for t in a.text] if a.text else _default_texts()
    codec = TextCodec(load_manifest(a.reference))
    ids = np.concatenate([codec.encode(t.read_text(errors="replace")) for t in texts])[: a.max_tokens].astype(np.int64)
    _, ref_full = teacher_forced_logprobs(a.reference, ids, keep_full=True)
    ref_top = ref_full.argmax(axis=1)
    rows = []
    for folder in [a.reference] + [f for f in a.folders if f != a.reference]:
        lp, full = teacher_forced_logprobs(folder, ids, keep_full=True)
        p_ref = np.exp(ref_full.astype(np.float64))
        kl = float((p_ref * (ref_full - full)).sum(axis=1).mean())
        m = load_manifest(folder)
        rows.append(
            {
                "folder": folder,
                "precision": m.target.precision,
                "graph": m.target.graph.flavour,
                "top1_agreement": float((full.argmax(axis=1) == ref_top).mean()),
                "kl_to_reference": kl,
                "perplexity": float(np.exp(-lp.mean())),
            }
        )
    print(f"{len(ids)} tokens of {', '.join(t.name for t in texts)}; reference {a.reference}")
    print(f"{'folder':40} {'precision':>9} {'graph':>8} {'top-1 agree':>12} {'KL(ref||x)':>11} {'perplexity':>11}")
    for r in rows:
        print(
            f"{r['folder']:40} {r['precision']:>9} {r['graph']:>8} {r['top1_agreement']:12.4f} "
            f"{r['kl_to_reference']:11.5f} {r['perplexity']:11.3f}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"tokens": len(ids), "texts": [str(t) for t in texts], "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
