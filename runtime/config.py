"""RuntimeConfig: every runtime option in one frozen object, built once (from the CLI by
`from_args`) and handed to `Generator.load(folder, cfg)`. None means "the folder's default"
(manifest `defaults`, set at export or by `edgespec tune`), else edgespec's.

The core fields are declared here; each drafter's own options (its cut-offs, lookup sizes, cache
settings) are declared in its module (`DrafterSpec.options`, runtime/drafters/) and become
fields of RuntimeConfig too, so `RuntimeConfig(ngram_max=4)` and the CLI flag `--ngram-max` both
exist without this module knowing the drafter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from edgespec.runtime.drafters import options, spec_of
from edgespec.runtime.tree import TreeConfig

PROVIDERS = ("cpu", "cuda", "tensorrt", "trt")  # ONNX Runtime's three (engines/ort.py) + native TensorRT


@dataclass(frozen=True)
class CoreConfig:
    drafter: str | None = None  # a registered drafter (`edgespec generate --help` lists them); None: the folder's
    k: int | None = None  # num_speculative_tokens per step, the maximum when adaptive (None: the folder's)
    adaptive: bool | None = None  # choose k (trees: nodes) per step (greedy: measured costs; sampled: fixed ones)
    #                               (None: the folder's)
    provider: str = "cpu"  # cpu | cuda | tensorrt (ONNX Runtime execution providers) | trt (native TensorRT)
    draft_provider: str | None = None  # where drafting models run (None: with the target)
    threads: int | None = None  # intra-op threads (None: physical cores)
    thread_pool: str = "shared"  # CLI: shared (one ORT pool for every session) | session (a pool each)
    tree: TreeConfig = TreeConfig()  # token trees (nodes > 0) instead of chains (the drafters that grow trees)
    cuda_graph: bool | None = None  # cuda provider: capture target/draft calls as CUDA graphs (folders exported
    #                                 with --host-prologue); None: wherever the folder allows, False: never
    reuse_kv: bool = True  # keep KV rows across calls and skip prefilling a shared prompt prefix
    verify: bool = False  # check every file's sha256 against the manifest at load (sizes are always checked)

    def resolve(self, defaults) -> CoreConfig:
        """This config with every None filled from a folder's manifest defaults, then edgespec's."""

        def pick(mine, folder, fallback):
            return mine if mine is not None else (folder if folder is not None else fallback)

        folder_opts = defaults.options or {}
        opts = {o.name: pick(getattr(self, o.name), folder_opts.get(o.name), o.fallback) for o in self.options()}
        return dataclasses.replace(
            self,
            drafter=pick(self.drafter, defaults.drafter, "ngram"),
            k=pick(self.k, defaults.k, 4),
            adaptive=pick(self.adaptive, defaults.adaptive, False),
            **opts,
        )

    @classmethod
    def options(cls) -> tuple:
        """The drafter options that are fields of this config class (drafters registered before it was made)."""
        return tuple(f.metadata["option"] for f in dataclasses.fields(cls) if "option" in f.metadata)

    def check(self) -> None:
        if self.provider not in PROVIDERS or (self.draft_provider or "cpu") not in PROVIDERS:
            raise ValueError(
                f"provider {self.provider!r} / draft provider {self.draft_provider!r}: choose from "
                f"{', '.join(PROVIDERS)}"
            )
        if self.drafter is not None:
            spec_of(self.drafter)  # an unknown name fails here, before anything loads
        if self.k is not None and self.k < 0:
            raise ValueError(f"k={self.k}: num_speculative_tokens must be >= 0")
        for o in self.options():
            allowed, value = o.allowed(), getattr(self, o.name)
            if allowed and value is not None and value not in allowed:
                raise ValueError(f"{o.name} {value!r}: choose from {', '.join(map(str, allowed))}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads}: need at least 1 (or leave it unset for the physical cores)")

    @classmethod
    def from_args(cls, a, **override):
        """From the runtime flags of an argparse namespace (edgespec.cli); `override` wins."""
        flags = vars(a)
        values = {f.name: flags[f.name] for f in dataclasses.fields(cls) if f.name in flags and f.name != "tree"}
        tree = flags.get("tree")
        if isinstance(tree, str) and "," not in tree:  # bench takes a comma-separated list instead
            values["tree"] = TreeConfig.parse(tree)
        if isinstance(values.get("k"), str):  # bench: a list of k values
            del values["k"]
        return cls(**(values | override))


def _option_field(o):
    typ = o.type if o.default is not None else (o.type | None)
    return o.name, typ, dataclasses.field(default=o.default, metadata={"option": o})


# the core fields, then every registered drafter's options (one comment each, in the drafter's module)
RuntimeConfig = dataclasses.make_dataclass(
    "RuntimeConfig", [_option_field(o) for o in options()], bases=(CoreConfig,), frozen=True
)
RuntimeConfig.__module__ = __name__
RuntimeConfig.__doc__ = "Every runtime option: CoreConfig's fields and each registered drafter's options."


@dataclass(frozen=True)
class NoDefaults:
    """The defaults of no folder (a generator built on bare engines, as the tests do)."""

    drafter: str | None = None  # edgespec's default drafter
    k: int | None = None  # edgespec's default k
    adaptive: bool | None = None  # edgespec's default
    options: dict | None = None  # edgespec's default drafter options
