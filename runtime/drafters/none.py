"""The `none` drafter: plain decoding, nothing proposed, every step one T=1 target call (the baseline)."""

from __future__ import annotations

from edgespec.runtime.drafters import Drafter, DrafterSpec, register


class NoDrafter(Drafter):
    name = "none"


SPEC = register(
    DrafterSpec(
        name="none",
        order=0,
        summary="nothing: plain decoding, one T=1 target call per token (the baseline)",
        build=lambda ctx: NoDrafter(),
    )
)
