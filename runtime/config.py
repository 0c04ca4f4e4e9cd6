"""RuntimeConfig: every runtime option in one frozen object, built once (from the CLI by
`from_args`) and handed to `Generator.load(folder, cfg)`. None means "the folder's default"
(manifest `defaults`, set at export or by `edgespec tune`), else edgespec's.

The core fields are declared here; each drafter's own options (its cut-offs, lookup sizes, cache
settings) are declared in its module (`DrafterPlugin.options`, runtime/drafters/) and become
fields of RuntimeConfig too, so `RuntimeConfig(ngram_max=4)` and the CLI flag `--ngram-max` both
exist without this module knowing the drafter.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from edgespec.runtime.drafters import options, registry, spec_of, tree_names
from edgespec.runtime.tree import TreeConfig

PROVIDERS = ("cpu", "cuda", "tensorrt", "trt")  # ONNX Runtime's three (engines/ort.py) + native TensorRT
KV_DTYPES = ("fp16", "fp32")  # --kv-dtype choices (engines/context.py maps them to numpy's names)


@dataclass(frozen=True)
class CoreConfig:
    """The runtime options every folder has; a field with a "help" is a runtime flag of the CLI with
    that default (edgespec/cli_fields.py; --drafter and --k come with each command's own sense)."""

    drafter: str | None = field(default=None, metadata={"help": lambda: _drafter_help()})  # None: the folder's
    k: int | None = field(  # the maximum when adaptive
        default=None, metadata={"help": "num_speculative_tokens per step (default: the folder's default)"}
    )
    adaptive: bool | None = field(
        default=None,
        metadata={
            "help": "choose k per step (up to --k) from verify costs and running acceptance; k=0 when "
            "speculation does not pay; with --tree, verify each step's best-scored nodes, as many as "
            "pay by the measured width table (1: plain decoding); recycle and merged chains: the prefix "
            "that pays by its drafts' calibrated scores. Greedy: measured costs; sampling: fixed "
            "relative costs and accepted counts, so a seed still reproduces its output (default: the "
            "folder's default)"
        },
    )
    provider: str = field(
        default="cpu",
        metadata={
            "help": "cpu | cuda | tensorrt (ONNX Runtime execution providers) | trt (native TensorRT "
            "engines from `edgespec build-trt`). Default %(default)s",
            "choices": PROVIDERS,
        },
    )
    draft_provider: str | None = field(  # None: with the target
        default=None,
        metadata={
            "help": "run the draft model elsewhere than the target (e.g. cpu beside a cuda target)",
            "choices": PROVIDERS,
        },
    )
    threads: int | None = field(default=None, metadata={"help": "intra-op threads (default: physical cores)"})
    thread_pool: str = field(
        default="shared",
        metadata={
            "help": "shared (default): all ONNX Runtime sessions of the process run on one intra-op pool, so a "
            "drafter's call right after the target's finds the threads awake instead of waking its own; "
            "session: a pool per session (ONNX Runtime's default)",
            "choices": ("shared", "session"),
        },
    )
    tree: TreeConfig = field(  # CLI: a spec string, TreeConfig.parse (bench: comma-separated specs)
        default=TreeConfig(),
        metadata={"help": lambda: _tree_help(), "metavar": "NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]]", "type": str},
    )
    cuda_graph: bool | None = field(  # None: wherever the folder allows, False: never
        default=None,
        metadata={
            "help": "--provider cuda: capture each target/draft call shape once as an ONNX Runtime CUDA graph "
            "and replay it (needs a folder exported with --host-prologue; default: on where the folder "
            "allows); --no-cuda-graph: launch every kernel each call"
        },
    )
    max_len: int | None = field(  # None: 4096 or the folder's maximum if smaller; the KV caches are sized for it
        default=None,
        metadata={
            "help": "context in tokens (prompt + output) the KV caches are allocated for, up to the folder's "
            "maximum (its export's --max-len); rounded up to the folder's kv_bucket (default: 4096, or the "
            "maximum where that is smaller)",
            "metavar": "TOKENS",
        },
    )
    kv_dtype: str | None = field(  # None: fp16 where every graph sharing the target's cache reads it, else fp32
        default=None,
        metadata={
            "help": "the KV cache's element type: fp16 (half the bytes; the row kernel's attention reads it, "
            "each new row rounded to fp16 in every call, so speculative == plain still holds) or fp32 "
            "(default: fp16 where the folder's graphs take it, else fp32)",
            "choices": KV_DTYPES,
        },
    )
    reuse_kv: bool = True  # keep KV rows across calls and skip prefilling a shared prompt prefix
    verify: bool = field(
        default=False,
        metadata={
            "help": "check every file's sha256 against the manifest before loading (reads the whole folder; "
            "file sizes are always checked). `edgespec check FOLDER` does it without loading"
        },
    )

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
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"--max-len {self.max_len}: a context needs at least 1 token (or leave it unset)")
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"--kv-dtype {self.kv_dtype!r}: choose {' or '.join(KV_DTYPES)}")
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


def _drafter_help() -> str:
    return "; ".join(f"{n}: {s.summary}" for n, s in registry().items()) + " (default: the folder's default)"


def _tree_help() -> str:
    return (
        f"draft token trees instead of chains ({', '.join(tree_names())}): at most NODES "
        "tokens per verify call incl. the pending one (<= k+1 of the folder), paths up to DEPTH (default "
        "4), BRANCH children per expanded node and BEAM nodes expanded per depth (default 2, 2; "
        "head drafters: EAGLE-2 style by path probability; multi-token heads: each head's top tokens "
        "by path probability; ngram: a trie of earlier matches; suffix: the most frequent continuations); "
        "MIN_SCORE leaves out head candidates whose path probability is lower (default 0). Greedy output "
        "stays identical, sampling lossless. bench: comma-separated specs, run next to the chains. e.g. "
        "--tree 6:5:1:1:0.4 or 9:4:2:2"
    )


def _option_field(o):
    """A drafter's option as a RuntimeConfig field, its runtime flag (--name-with-dashes) in its metadata."""
    typ = o.type if o.default is not None else (o.type | None)
    if o.type is bool:
        flag = {"help": o.help, "action": argparse.BooleanOptionalAction}
    else:
        flag = {"help": o.help, "choices": o.allowed, "metavar": None if o.choices else o.name.split("_")[-1].upper()}
    return o.name, typ, dataclasses.field(default=o.default, metadata={"option": o} | flag)


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
