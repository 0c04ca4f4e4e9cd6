"""Token recycling (after Luo et al. 2024, arXiv 2408.08696): draft from what the target itself
predicted the last time it saw the same context, with no model call.

Every target call returns, beside its logits, each row's top-8 next tokens and their probabilities
(the graph's TopK output, the engine's `last_topk`): prefill chunks, verified chains, rejected drafts
and every tree node alike; the drafter's observe hooks (base.Drafter.observe / observe_prefill) hand
them over. The recycle table keeps the latest of them per context of the last 1 .. `orders` tokens
(default 3), and a later context drafts from its longest order present.

The table lives in the generator's drafter store: across requests and drafter switches, for the
generator's life; with --suffix-cache FILE it is saved beside it (FILE's stem + .recycle.npz) every
`SAVE_EVERY` requests and loaded at the next start; else it starts from the folder's own table,
FOLDER/recycle.npz, which `edgespec warm` fills from the model's own answers.

Where each part lives:
  table.py        the table (contexts, keys, slots, updates, lookup) and its .npz file
  calibration.py  the online estimate of each draft's chance of being kept (merged trees, --adaptive)
  drafter.py      the recycle drafter (chains, sampled drafts, the tree grower) and the shared table
  merged.py       the merged drafter: a lookup first, the table after
  warm.py         `edgespec warm`: fill a folder's table (registered here: RecyclePlugin.commands)
"""

from __future__ import annotations

from edgespec.runtime.drafters import Command, Drafter, DrafterPlugin, Option, register
from edgespec.runtime.drafters.recycle.calibration import Calibration
from edgespec.runtime.drafters.recycle.drafter import SAVE_EVERY, SHARPEN, RecycleDrafter, grow, shared_table
from edgespec.runtime.drafters.recycle.merged import LOOKUPS, MergedDrafter
from edgespec.runtime.drafters.recycle.table import (
    MAX_ORDERS,
    WARM_FILE,
    RecycleConfig,
    RecycleError,
    RecycleTable,
)

__all__ = [
    "SAVE_EVERY",
    "WARM_FILE",
    "Calibration",
    "MergedDrafter",
    "RecycleConfig",
    "RecycleDrafter",
    "RecycleError",
    "RecycleTable",
    "grow",
]

WARM = Command(
    name="warm",
    module="edgespec.runtime.drafters.recycle.warm",
    help="fill a folder's recycle table from the model's own answers or a corpus (FOLDER/recycle.npz)",
    description="Fill FOLDER/recycle.npz, where every later Generator of the folder starts its recycle "
    "table: --answers N has the folder answer N wide-mix chat prompts (greedy; e.g. 300, ~2 min for the "
    "default model on 2 cores), --text prefills a corpus. Forward passes only, no training; prompts "
    "sharing an 8-word window with an eval prompt are left out, eval prompt files refused "
    "(runtime/drafters/recycle/warm.py).",
)


class RecyclePlugin(DrafterPlugin):
    name = "recycle"
    order = 2
    aliases = ("token_recycling",)
    summary = (
        "token recycling: the target's own top-8 next tokens from the last time it saw the last 3/2/1 "
        "tokens (every verified row of every call, kept across requests; no model call)"
    )
    trees = True
    draft_cost = 0.01
    redrafts = True
    commands = (WARM,)
    options = (
        Option(
            "recycle_min_prob",
            float,
            0.0,
            "recycle drafter: stop a chain when its path's stored target probability falls below this (default 0)",
        ),
        Option(
            "recycle_sharpen",
            float,
            SHARPEN,
            "recycle drafter, sampling: draw each draft from its row's stored candidates at the call's "
            f"temperature / this (default {SHARPEN:g}; inf: always the first candidate)",
        ),
        Option(
            "recycle_orders",
            int,
            3,
            f"recycle drafter: the longest context keyed, in tokens (1..{MAX_ORDERS}; default 3)",
        ),
        Option(
            "recycle_every_row",
            str,
            "1234",
            "recycle drafter: the context orders written from every row a verify call checked (rejected "
            "drafts and tree nodes too); the others from committed rows only (default 1234: all)",
        ),
        Option(
            "recycle_bits",
            int,
            16,
            "recycle drafter: 2**bits hashed slots for each of the 2- and 3-token contexts (default 16: "
            "10 MB with a 49k vocabulary)",
        ),
    )

    def build(self, ctx) -> Drafter:
        return RecycleDrafter(shared_table(ctx), ctx.cfg.recycle_min_prob, ctx.cfg.recycle_sharpen)


PLUGIN = register(RecyclePlugin())


class MergedPlugin(DrafterPlugin):
    name = "merged"
    order = 5
    summary = (
        "suffix decoding (or prompt lookup) first, token recycling after: chains continued from the table, "
        "trees of both scored by calibrated acceptance and sized by the width table (--adaptive)"
    )
    trees = True
    draft_cost = 0.04
    redrafts = True
    options = (
        Option(
            "merged_lookup",
            str,
            "suffix",
            "merged drafter: the lookup drafted first, suffix (default) or ngram (prompt lookup)",
            choices=LOOKUPS,
        ),
    )

    def build(self, ctx) -> Drafter:
        from edgespec.runtime.drafters.ngram import NgramDrafter, ngram_config
        from edgespec.runtime.drafters.suffix import SuffixDrafter, recent_requests

        c = ctx.cfg
        lookup = NgramDrafter(ngram_config(c)) if c.merged_lookup == "ngram" else SuffixDrafter(recent_requests(ctx))
        return MergedDrafter(lookup, RecycleDrafter(shared_table(ctx), c.recycle_min_prob, c.recycle_sharpen))


MERGED = register(MergedPlugin())
