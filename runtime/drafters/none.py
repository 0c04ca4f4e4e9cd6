"""The `none` drafter: plain decoding, nothing proposed, every step one T=1 target call (the baseline)."""

from __future__ import annotations

from edgespec.runtime.drafters import Drafter, DrafterPlugin, register


class NoDrafter(Drafter):
    name = "none"


class NonePlugin(DrafterPlugin):
    name = "none"
    order = 0
    summary = "nothing: plain decoding, one T=1 target call per token (the baseline)"

    def build(self, ctx) -> Drafter:
        return NoDrafter()


PLUGIN = register(NonePlugin())
