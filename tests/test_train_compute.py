"""Training and data generation on the CPU's matrix units: the probe's rule (bf16 only where a flag
and the timing agree), and a tiny EAGLE run and tiny data run in both computes."""

import json

import numpy as np
import pytest

from edgespec.export.train import matmul_probe as mp

torch = pytest.importorskip("torch")


def test_decide_needs_the_flag_and_the_speedup():
    zen4 = {"avx512f", "avx512_bf16", "avx512_vnni"}
    assert mp.decide("auto", zen4, 60.0, 20.0).dtype == "bf16"
    slow = mp.decide("auto", zen4, 60.0, 50.0)  # 1.2x: not worth the precision
    assert slow.dtype == "fp32" and "1.3x" in slow.reason and "avx512_bf16" in slow.reason
    assert mp.decide("auto", zen4, 60.0, 60.0 / 1.3).dtype == "bf16"  # the bound itself counts
    plain = mp.decide("auto", {"avx2", "fma"}, 60.0, 10.0)  # no flag: emulated bf16, never auto
    assert plain.dtype == "fp32" and "avx512_bf16" in plain.reason and plain.flag is None
    assert mp.decide("auto", zen4).dtype == "fp32"  # flag but not timed
    amx = mp.decide("auto", {"amx_bf16", "amx_tile", "avx512_bf16"}, 90.0, 10.0)
    assert amx.dtype == "bf16" and amx.flag == "amx_bf16" and amx.record()["probe_ms"] == {"fp32": 90.0, "bf16": 10.0}
    assert mp.decide("fp32", zen4, 60.0, 1.0).dtype == "fp32"  # asked: taken as asked
    forced = mp.decide("bf16", {"avx2"})
    assert forced.dtype == "bf16" and "emulates" in forced.reason
    assert "\n" not in slow.reason and "\n" not in forced.reason  # one line
    with pytest.raises(mp.ComputeError, match="auto, bf16, fp32"):
        mp.decide("fp16", zen4)


def test_cpu_flags_reads_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512_bf16\n\nflags : x\n")
    assert mp.cpu_flags(f) == {"fpu", "avx2", "avx512_bf16"}
    assert mp.cpu_flags(tmp_path / "missing") == set()  # not Linux: no flags, fp32


def test_probe_times_both_dtypes_quickly():
    fp32_ms, bf16_ms = mp.time_matmul(budget_s=0.1, shape=(64, 32, 48))
    assert fp32_ms > 0 and bf16_ms > 0
    c = mp.choose("fp32")
    assert c.dtype == "fp32" and mp.choose("fp32") is c  # once per process


def _tiny_data(src, out, compute: str):
    """Self-distillation data of the tiny target (48 prompts, 24 new tokens) in the given compute."""
    from edgespec.export.train.head_data import DataConfig, generate_data

    cfg = DataConfig(
        out=str(out),
        target=str(src),
        n_general=24,
        n_code_chat=12,
        n_completion=12,
        max_new_tokens=24,
        batch=16,
        compute=compute,
    )
    return generate_data(cfg, progress=False)


@pytest.fixture(scope="module")
def tiny_data(tiny_models, tmp_path_factory):
    return _tiny_data(tiny_models["llama"], tmp_path_factory.mktemp("compute") / "data", "fp32")


def test_data_in_bf16_matches_fp32_prompt_features(tiny_models, tiny_data, tmp_path):
    """The same prompts through the bf16-autocast target: the prompt positions' features (same
    tokens in both) agree to bf16's precision; the run is logged with its compute dtype."""
    from edgespec.export.train.head_data import load_shards

    bf = _tiny_data(tiny_models["llama"], tmp_path / "bf", "bf16")
    log = json.loads((bf / "generation.json").read_text())
    assert log[-1]["compute"] == "bf16" and log[-1]["tokens_per_s"] > 0
    assert json.loads((tiny_data / "generation.json").read_text())[-1]["compute"] == "fp32"
    t32, f32, s32, p32 = load_shards(tiny_data)
    t16, f16, s16, p16 = load_shards(bf)
    assert np.array_equal(p32, p16)
    for s in range(len(p32)):
        a, b = f32[s32[s] : s32[s] + p32[s]], f16[s16[s] : s16[s] + p16[s]]
        assert np.array_equal(t32[s32[s] : s32[s] + p32[s]], t16[s16[s] : s16[s] + p16[s]])
        rel = np.linalg.norm(a.astype(np.float32) - b) / np.linalg.norm(a.astype(np.float32))
        assert rel < 0.05, (s, rel)


def test_tiny_eagle_trains_in_both_computes(tiny_models, tiny_data, tmp_path):
    """The same data and schedule in fp32 and under bf16 autocast: both train, record how, keep fp32
    master weights, and reach held-out top-1 within a sane margin of each other (the tiny target's
    answers are easy: the learning itself is compared on `_Toy` below)."""
    from edgespec.export.drafters.eagle.train import TrainConfig, train

    top1, weights = {}, {}
    for compute in ("fp32", "bf16"):
        out = train(
            TrainConfig(
                data=str(tiny_data),
                out=str(tmp_path / compute),
                target=str(tiny_models["llama"]),
                draft_vocab=64,
                epochs=3,
                minutes=2,
                batch_tokens=512,
                compute=compute,
                holdout=0.2,
                skip_copies=False,
            ),
            progress=False,
        )
        rec = json.loads((out / "config.json").read_text())["eagle"]
        run = rec["training"]
        assert run["compute"] == compute and run["threads"] == torch.get_num_threads() and run["rows_per_s"] > 0
        assert compute in run["compute_reason"]
        top1[compute] = rec["holdout"]["top1_step1"]
        weights[compute] = torch.load(out / "checkpoint.pt", weights_only=False)["head"]
    assert abs(top1["bf16"] - top1["fp32"]) < 0.1, top1
    assert all(w.dtype == torch.float32 for w in weights["bf16"].values())  # master weights
    assert not torch.equal(weights["bf16"]["fc.weight"], weights["fp32"]["fc.weight"])  # bf16 did run


class _Toy:
    """A recipe whose task starts at chance: a 3-layer MLP learns a fixed random teacher's argmax
    over 32 classes from 64-wide inputs."""

    def __init__(self, model: torch.nn.Module, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        teacher = torch.randn(64, 32, generator=g)
        self.x = torch.randn(6000, 64, generator=g)
        self.y = (self.x @ teacher).argmax(-1)
        self.model = model
        self.saved: dict = {}

    def batches(self, epoch: float):
        order = torch.randperm(5000, generator=torch.Generator().manual_seed(int(epoch)))
        return [order[i : i + 250] for i in range(0, 5000, 250)]

    def loss(self, idx):
        logits = self.model(self.x[idx])
        loss = torch.nn.functional.cross_entropy(logits.float(), self.y[idx])
        return loss, [float((logits.argmax(-1) == self.y[idx]).float().mean())], len(idx)

    def estimate(self) -> dict:
        return {"top1": float((self.model(self.x[5000:]).argmax(-1) == self.y[5000:]).float().mean())}

    def save(self, step: int, epoch: float, est: dict, training: dict) -> str:
        self.saved = {"est": est, "training": training}
        return f"top-1 {est['top1']:.3f}"


def test_fit_learns_alike_in_fp32_and_bf16(tmp_path):
    """`fit` on a task that starts at chance: held-out top-1 under bf16 autocast within a few
    points of fp32's, and the training record says which ran."""
    from edgespec.export.train import trainer

    top1 = {}
    for dtype in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256),
            torch.nn.SiLU(),
            torch.nn.Linear(256, 256),
            torch.nn.SiLU(),
            torch.nn.Linear(256, 32),
        )
        toy = _Toy(model)
        plan = trainer.Plan(tag="[toy]", unit="step", lr=3e-3, warmup=10, total_steps=160, epochs=8, minutes=1)
        ckpt = trainer.Checkpoint(tmp_path / f"{dtype}.pt", "model", {})
        record = trainer.fit(model, toy, plan, ckpt, None, progress=False, compute=mp.decide(dtype, set()))
        assert record["compute"] == dtype and toy.saved["training"] == record and record["steps"] == 160
        top1[dtype] = toy.saved["est"]["top1"]
    assert top1["fp32"] > 0.6, top1  # it learned (chance: 1/32)
    assert abs(top1["bf16"] - top1["fp32"]) < 0.05, top1
