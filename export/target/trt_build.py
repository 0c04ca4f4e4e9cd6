"""`edgespec build-trt`: TensorRT engines from an engine folder's ONNX graphs (needs `tensorrt`).

One engine per model; one optimization profile per phase width (min = opt = max on T, the cache
window S over [kv_bucket, max_len]); precision is whatever the ONNX carries (strongly typed
network: export with --precision fp16 for GPUs; int4 MatMulNBits is an ORT contrib op that
TensorRT's parser does not take). The timing cache is kept in the folder, so a rebuild is fast.
The engine files are recorded in the manifest with the TensorRT version and the GPU they were
built for; the runtime refuses an engine built for another pair.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import replace
from pathlib import Path

from edgespec.engines.manifest import TrtInfo, load_manifest


class TrtBuildError(RuntimeError):
    pass


@contextlib.contextmanager
def computed_inline(onnx_path: Path, man, spec):
    """The graph as TensorRT's parser can read it: a model's rotary tables are computed at load
    (engines/rope.py), so they go into a copy of the graph beside it (its other initializers still
    name the weights file); the copy is removed after parsing. A graph without them: itself."""
    computed = {name: w for name, w in spec.weights.items() if w.rope is not None}
    if not computed:
        yield onnx_path
        return
    import onnx
    from onnx import numpy_helper

    from edgespec.engines import rope

    model = onnx.load(str(onnx_path), load_external_data=False)
    for init in model.graph.initializer:
        if init.name in computed:
            w = computed[init.name]
            table = rope.checked_table(init.name, w.rope, tuple(w.shape), w.dtype)
            init.CopyFrom(numpy_helper.from_array(table, init.name))
    tmp = onnx_path.with_name(f".{onnx_path.stem}.trt_parse.onnx")
    onnx.save(model, str(tmp))
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def build_trt(folder: str | Path, workspace_gib: float = 4.0) -> dict:
    """Build the target's and the draft's engines and record them in the manifest; the target's
    record (TrtInfo.to_json())."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise TrtBuildError(
            "building TensorRT engines needs the `tensorrt` package (from NVIDIA's index; "
            "PyPI's tensorrt-cu* wheels are stubs that download it at install time)"
        ) from e
    from edgespec.engines.device import CudaOps

    folder = Path(folder)
    man = load_manifest(folder)
    gpu = CudaOps().device_name()
    logger = trt.Logger(trt.Logger.WARNING)
    built = {}
    models = man.models()
    for role, spec in (("target", man.target), ("draft", models.get("draft"))):
        if spec is None:
            continue
        _check_parsable(role, spec)
        fname, profiles = _build_engine(trt, logger, folder, man, role, spec, workspace_gib)
        built[role] = replace(spec, tensorrt=TrtInfo(fname, trt.__version__, gpu, profiles))
    for role, spec in built.items():
        man = man.replace_model(role, spec)
    man.save()
    return man.target.tensorrt.to_json()


def _check_parsable(role: str, spec) -> None:
    """A graph TensorRT can parse: not int4 (MatMulNBits), the portable flavour (no contrib ops)."""
    if spec.precision == "int4":
        raise TrtBuildError(
            f"the {role} model is int4 (ORT MatMulNBits), which TensorRT cannot parse; "
            "export with --precision fp16 for TensorRT"
        )
    if spec.graph.flavour != "portable":
        raise TrtBuildError(
            f"the {role} graph is the {spec.graph.flavour} flavour (ONNX Runtime contrib ops), "
            "which TensorRT cannot parse; export with --precision fp16 (--graph auto or "
            "portable) for TensorRT"
        )


def _build_engine(trt, logger, folder: Path, man, role: str, spec, workspace_gib: float) -> tuple[str, dict]:
    """One model's engine, <role>.engine in the folder (one optimization profile per phase width,
    the folder's timing cache reused and updated): (its file name, width -> profile index)."""
    cache_path = folder / "trt_timing.cache"
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    onnx_path = folder / spec.graph.file
    with computed_inline(onnx_path, man, spec) as parsed:
        ok = parser.parse_from_file(str(parsed))
    if not ok:
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TrtBuildError(f"TensorRT could not parse {onnx_path.name}: {errs}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 2**30))
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    profiles = {}
    s_min, s_max = man.kv_bucket, man.max_len
    s_opt = min(s_max, max(s_min, 4 * man.kv_bucket))
    for w in spec.widths():
        p = builder.create_optimization_profile()
        for t in spec.graph.inputs:  # T fixed at w; the cache window S over [kv_bucket, max_len]
            for name in t.names():
                p.set_shape(name, t.shape_at(w, s_min), t.shape_at(w, s_opt), t.shape_at(w, s_max))
        profiles[w] = config.add_optimization_profile(p)
    print(f"edgespec: building the {role} TensorRT engine ({len(profiles)} profiles) ...", file=sys.stderr)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise TrtBuildError(f"TensorRT failed to build the {role} engine (see the log above)")
    fname = f"{role}.engine"
    tmp = folder / (fname + ".partial")
    tmp.write_bytes(bytes(blob))
    os.replace(tmp, folder / fname)
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return fname, profiles
