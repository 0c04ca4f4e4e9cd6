"""RuntimeConfig: every runtime option in one frozen object, built once (from the CLI by
`from_args`) and handed to `Generator.load(folder, cfg)`. None means "the folder's default"
(manifest `defaults`, set at export or by `edgespec tune`), else edgespec's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from edgespec.runtime.drafters import NgramConfig
from edgespec.runtime.tree import TreeConfig

# EAGLE chain cut-off on the head's path probability (the product of its confidences so far): a
# verify row costs a good part of a decode on a CPU, so rows unlikely to be kept do not pay
EAGLE_MIN_CONFIDENCE = 0.25
MEDUSA_MIN_CONFIDENCE = 0.4  # Medusa chain cut-off on each head's own probability (docs/results)
PROVIDERS = ("cpu", "cuda", "tensorrt", "trt")  # ONNX Runtime's three (engines/ort.py) + native TensorRT
HYBRID_LOOKUPS = ("suffix", "ngram")  # what hybrid pairs the EAGLE head with
HYBRID_HEADS = ("eagle", "eagle3", "dflash")  # the model drafter hybrid pairs the lookup with


@dataclass(frozen=True)
class RuntimeConfig:
    drafter: str | None = None  # none | ngram | suffix | draft | eagle | hybrid | medusa | eagle3 | dflash
    #                             (None: the folder's default)
    k: int | None = None  # num_speculative_tokens per step, the maximum when adaptive (None: the folder's)
    adaptive: bool | None = None  # choose k per step (greedy: measured costs; sampled: fixed ones) (None: the folder's)
    provider: str = "cpu"  # cpu | cuda | tensorrt (ONNX Runtime execution providers) | trt (native TensorRT)
    draft_provider: str | None = None  # where drafting models run (None: with the target)
    threads: int | None = None  # intra-op threads (None: physical cores)
    thread_pool: str = "shared"  # CLI: shared (one ORT pool for every session) | session (a pool each)
    ngram_min: int = 1  # prompt lookup: shortest suffix matched
    ngram_max: int = 3  # prompt lookup: longest suffix, tried first
    tree: TreeConfig = TreeConfig()  # token trees (nodes > 0) instead of chains: ngram, suffix, eagle, hybrid, medusa
    eagle_min_confidence: float | None = None  # EAGLE: stop a chain when the head's own p(d_1..d_i) is lower
    medusa_min_confidence: float | None = None  # Medusa: stop a chain at the first head less sure than this
    fuse_head: bool = True  # eagle/hybrid on the CPU: verify with the target+head graph (head rides along)
    cuda_graph: bool | None = None  # cuda provider: capture target/draft calls as CUDA graphs (folders exported
    #                                 with --host-prologue); None: wherever the folder allows, False: never
    reuse_kv: bool = True  # keep KV rows across calls and skip prefilling a shared prompt prefix
    verify: bool = False  # check every file's sha256 against the manifest at load (sizes are always checked)
    suffix_cache_tokens: int = 1_000_000  # suffix drafter: recent requests' tokens kept in its cache
    suffix_cache: str | None = None  # suffix drafter: .npy file its cache is loaded from and saved to
    hybrid_lookup: str = "suffix"  # hybrid: suffix (per step, suffix decoding or the head by expected
    #                                accepted length) | ngram (prompt lookup where it matches, else the head)
    hybrid_head: str = "eagle"  # hybrid's model drafter: eagle | eagle3 | dflash (the folder must ship it)

    @property
    def ngram(self) -> NgramConfig:
        return NgramConfig(self.ngram_min, self.ngram_max)

    def resolve(self, defaults) -> RuntimeConfig:
        """This config with every None filled from a folder's manifest defaults, then edgespec's."""
        def pick(mine, folder, fallback):
            return mine if mine is not None else (folder if folder is not None else fallback)

        return dataclasses.replace(
            self, drafter=pick(self.drafter, defaults.drafter, "ngram"), k=pick(self.k, defaults.k, 4),
            adaptive=pick(self.adaptive, defaults.adaptive, False),
            eagle_min_confidence=pick(self.eagle_min_confidence, defaults.eagle_min_confidence,
                                      EAGLE_MIN_CONFIDENCE),
            medusa_min_confidence=pick(self.medusa_min_confidence, defaults.medusa_min_confidence,
                                       MEDUSA_MIN_CONFIDENCE))

    def check(self) -> None:
        if self.provider not in PROVIDERS or (self.draft_provider or "cpu") not in PROVIDERS:
            raise ValueError(f"provider {self.provider!r} / draft provider {self.draft_provider!r}: choose from "
                             f"{', '.join(PROVIDERS)}")
        if self.k is not None and self.k < 0:
            raise ValueError(f"k={self.k}: num_speculative_tokens must be >= 0")
        if self.hybrid_lookup not in HYBRID_LOOKUPS:
            raise ValueError(f"hybrid_lookup {self.hybrid_lookup!r}: choose from {', '.join(HYBRID_LOOKUPS)}")
        if self.hybrid_head not in HYBRID_HEADS:
            raise ValueError(f"hybrid_head {self.hybrid_head!r}: choose from {', '.join(HYBRID_HEADS)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads}: need at least 1 (or leave it unset for the physical cores)")

    @classmethod
    def from_args(cls, a, **override) -> RuntimeConfig:
        """From the runtime flags of an argparse namespace (edgespec.cli); `override` wins."""
        flags = vars(a)
        values = {f.name: flags[f.name] for f in dataclasses.fields(cls) if f.name in flags and f.name != "tree"}
        tree = flags.get("tree")
        if isinstance(tree, str) and "," not in tree:  # bench takes a comma-separated list instead
            values["tree"] = TreeConfig.parse(tree)
        if isinstance(values.get("k"), str):  # bench: a list of k values
            del values["k"]
        return cls(**(values | override))


@dataclass(frozen=True)
class NoDefaults:
    """The defaults of no folder (a generator built on bare engines, as the tests do)."""

    drafter: str | None = None  # edgespec's default drafter
    k: int | None = None  # edgespec's default k
    adaptive: bool | None = None  # edgespec's default
    eagle_min_confidence: float | None = None  # edgespec's default cut-off
    medusa_min_confidence: float | None = None  # edgespec's default cut-off
