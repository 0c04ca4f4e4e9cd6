"""The CLI flags made from the config dataclasses (edgespec/cli_fields.py): one default and one help
per option, the flag's default the field's, so a command with no flags builds the config the
Python API builds with no arguments."""

import argparse
import dataclasses

import pytest

from edgespec.cli import build_parser
from edgespec.cli_fields import add_fields, cli_default, config_from, flag_fields
from edgespec.cli_offline import DEFAULT_ENGINE
from edgespec.runtime.apps.bench import BenchConfig
from edgespec.runtime.apps.chat import ChatSettings
from edgespec.runtime.apps.server_config import ServeConfig
from edgespec.runtime.apps.tune import TuneConfig
from edgespec.runtime.config import RuntimeConfig
from edgespec.runtime.sampling import SamplingConfig

RUNTIME_COMMANDS = {"generate": ["--prompt", "x"], "chat": [], "serve": [], "tune": [], "demo": []}


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def _export_config():
    from edgespec.export.target.spec import ExportConfig

    return ExportConfig


def test_export_flags_have_the_fields_defaults():
    """`edgespec export` with no flags is ExportConfig(): --precision auto in both (the one default)."""
    ExportConfig = _export_config()
    a = _parse("export")
    assert config_from(ExportConfig, a) == ExportConfig()
    assert ExportConfig().precision == "auto" and a.precision == "auto"
    for name, f in flag_fields(ExportConfig).items():
        assert getattr(a, name) == f.default, name
    # every drafter's export option is a flag too; the one field without a flag is the progress bar
    assert set(flag_fields(ExportConfig)) == {f.name for f in dataclasses.fields(ExportConfig)} - {"progress"}


@pytest.mark.parametrize("cmd", sorted(RUNTIME_COMMANDS))
def test_runtime_flags_have_the_fields_defaults(cmd):
    """Every runtime command with no flags gives RuntimeConfig() (None: the folder's default)."""
    a = _parse(cmd, *RUNTIME_COMMANDS[cmd])
    assert RuntimeConfig.from_args(a) == RuntimeConfig()
    for name, f in flag_fields(RuntimeConfig).items():
        if name not in vars(a):
            assert cmd == "tune" and name in ("drafter", "k")  # tune tries every drafter and k itself
            continue
        assert getattr(a, name) == cli_default(f), (cmd, name)
        assert cli_default(f) in (f.default, None), name  # None: a default argparse cannot hold (the tree)


def test_bench_and_serve_flags_have_the_fields_defaults(monkeypatch):
    monkeypatch.delenv("EDGESPEC_API_KEY", raising=False)
    assert config_from(ServeConfig, _parse("serve")) == ServeConfig()
    a = _parse("bench")
    cfg = config_from(BenchConfig, a, runtime=BenchConfig.runtime)
    assert cfg == BenchConfig(engine=a.engine)
    assert cfg.drafters == ("none", "ngram") and cfg.limit == 20


def test_flags_set_the_fields():
    ExportConfig = _export_config()
    a = _parse("export", "--num-speculative-tokens", "3", "--no-validate", "--no-trees", "--eagle3-head", "h")
    cfg = config_from(ExportConfig, a)
    assert (cfg.k, cfg.validate, cfg.trees, cfg.eagle3) == (3, False, False, "h")
    a = _parse("serve", "--allow-origin", "http://a", "--allow-origin", "http://b", "--port", "0")
    assert config_from(ServeConfig, a).allow_origin == ("http://a", "http://b") and a.port == 0
    with pytest.raises(SystemExit):
        _parse("serve", "--port", "70000")
    a = _parse("bench", "--drafter", "none,eagle", "--raw-prompts", "--no-adaptive")
    cfg = config_from(BenchConfig, a, runtime=BenchConfig.runtime)
    assert cfg.drafters == ("none", "eagle") and cfg.raw and cfg.adaptive is False
    a = _parse(
        "generate", "--prompt", "x", "--tree", "6:5", "--no-fuse-head", "--hybrid-lookup", "ngram",
        "--eagle-min-confidence", "0.3",
    )  # fmt: skip
    cfg = RuntimeConfig.from_args(a)
    assert (cfg.tree.nodes, cfg.fuse_head, cfg.hybrid_lookup, cfg.eagle_min_confidence) == (6, False, "ngram", 0.3)


def test_api_key_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("EDGESPEC_API_KEY", "k1")
    assert _parse("serve").api_key == "k1" and _parse("serve", "--api-key", "k2").api_key == "k2"


def test_one_help_per_option():
    """Each flag's help is its field's: the help of every flag field shows in --help."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    from edgespec.export.train.answer_data import AnswerDataConfig
    from edgespec.export.train.text_data import TextDataConfig

    configs = [("export", _export_config()), ("generate", RuntimeConfig), ("serve", ServeConfig)]
    configs += [("generate", SamplingConfig), ("chat", ChatSettings), ("tune", TuneConfig)]
    configs += [("text-data", TextDataConfig), ("answer-data", AnswerDataConfig)]
    for cmd, cls in configs:
        helps = {a.dest: a.help for a in sub.choices[cmd]._actions}
        for name, f in flag_fields(cls).items():
            text = f.metadata["help"]() if callable(f.metadata["help"]) else f.metadata["help"]
            assert helps[name] == text, (cmd, name)


@dataclasses.dataclass(frozen=True)
class Required:
    out: str = dataclasses.field(metadata={"help": "{what} folder"})
    n: int = dataclasses.field(default=2, metadata={"help": "(default {default})"})


def test_add_fields_types_and_actions():
    """The helper's own rules: the annotation gives the type, a bool False by default is --x, any other
    bool --x/--no-x, a tuple comma-separated values or, with action append, a repeatable flag."""

    @dataclasses.dataclass(frozen=True)
    class Toy:
        n: int = dataclasses.field(default=2, metadata={"help": "n (default %(default)s)"})
        rate: float | None = dataclasses.field(default=None, metadata={"help": "r"})
        on: bool = dataclasses.field(default=False, metadata={"help": "on"})
        keep: bool = dataclasses.field(default=True, metadata={"help": "keep"})
        ks: tuple[int, ...] = dataclasses.field(default=(1, 2), metadata={"help": "ks", "flag": "--k"})
        tags: tuple[str, ...] = dataclasses.field(default=(), metadata={"help": "t", "action": "append"})
        mode: str = dataclasses.field(default="a", metadata={"help": "m", "choices": lambda: ("a", "b")})
        name: str = dataclasses.field(default="x", metadata={"help": "n", "choices": lambda: ()})  # any
        hidden: int = 0  # no help: no flag

    p = argparse.ArgumentParser()
    add_fields(p, Toy)
    assert config_from(Toy, p.parse_args([])) == Toy()
    with pytest.raises(SystemExit):  # a field without a default is a required flag
        add_fields(q := argparse.ArgumentParser(), Required)
        q.parse_args([])
    assert config_from(Required, q.parse_args(["--out", "o"])) == Required("o")
    add_fields(r := argparse.ArgumentParser(), Required, fill={"what": "head"})  # help as a format string
    assert "head folder" in r.format_help() and "(default 2)" in r.format_help()
    a = p.parse_args(["--n", "3", "--rate", "0.5", "--on", "--no-keep", "--k", "4,5", "--tags", "x", "--mode", "b"])
    assert config_from(Toy, a) == Toy(3, 0.5, True, False, (4, 5), ("x",), "b")
    assert p.parse_args(["--name", "y"]).name == "y"
    assert "hidden" not in vars(a) and "n (default 2)" in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "c"])


def test_data_commands_build_their_configs():
    """text-data and answer-data: their flags are their configs' fields (required ones too)."""
    from edgespec.export.train.answer_data import AnswerDataConfig
    from edgespec.export.train.text_data import TextDataConfig

    req = ("--engine", "e", "--out", "o")
    assert config_from(TextDataConfig, _parse("text-data", *req)) == TextDataConfig("e", "o")
    assert config_from(AnswerDataConfig, _parse("answer-data", *req)) == AnswerDataConfig("e", "o")
    a = _parse("text-data", *req, "--sources", "doc,x.txt", "--tokens", "5", "--keep-out", "k.jsonl")
    assert config_from(TextDataConfig, a) == TextDataConfig(
        "e", "o", ("doc", "x.txt"), max_tokens=5, keep_out=("k.jsonl",)
    )
    assert config_from(AnswerDataConfig, _parse("answer-data", *req, "--prompts", "7")).n_prompts == 7


def test_app_flags_build_their_configs():
    """generate's sampling flags, chat's and tune's are their configs' fields, defaults included."""
    assert config_from(SamplingConfig, _parse("generate", "--prompt", "x")) == SamplingConfig()
    a = _parse("generate", "--prompt", "x", "--top-k", "5", "--seed", "3", "--typical-epsilon", "0.1")
    assert config_from(SamplingConfig, a) == SamplingConfig(top_k=5, seed=3, typical_epsilon=0.1)
    assert config_from(ChatSettings, _parse("chat")) == ChatSettings()
    assert config_from(ChatSettings, _parse("chat", "--temperature", "0.5")).temperature == 0.5
    tune = config_from(TuneConfig, _parse("tune"), runtime=RuntimeConfig())
    assert tune == TuneConfig(engine=DEFAULT_ENGINE) and tune.write
    assert not config_from(TuneConfig, _parse("tune", "--dry-run", "--limit", "3"), runtime=RuntimeConfig()).write


TRAIN = {  # command: (its config's module, class, flags setting its own fields, the fields they set)
    "train-eagle": ("eagle", "TrainConfig", ["--init", "h", "--no-skip-copies"], {"init": "h", "skip_copies": False}),
    "train-eagle3": ("eagle3", "Eagle3TrainConfig", ["--steps", "2"], {"n_steps": 2}),
    "train-medusa": ("medusa", "MedusaTrainConfig", ["--heads", "3", "--layers", "2"], {"n_heads": 3, "n_layers": 2}),
    "train-dflash": ("dflash", "TrainConfig", ["--block", "4", "--anchors", "5"], {"block_size": 4, "anchors": 5}),
}


@pytest.mark.parametrize("cmd", sorted(TRAIN))
def test_train_flags_build_the_kind_configs(cmd):
    """A train-<name> command's flags are its kind's training config's fields (one default each: the
    command with no flags trains what the config trains with no arguments); the configs are
    torch-free, so the CLI builds its parsers without torch."""
    import importlib

    module, name, flags, fields = TRAIN[cmd]
    cls = getattr(importlib.import_module(f"edgespec.export.drafters.{module}"), name)
    assert config_from(cls, _parse(cmd, "--out", "o"), data="d") == cls(data="d", out="o")
    a = _parse(cmd, "--out", "o", "--minutes", "2", "--lr", "0.01", *flags)
    assert config_from(cls, a, data="d") == cls(data="d", out="o", minutes=2.0, lr=0.01, **fields)
    assert (a.prompts, a.data, a.gen_batch) == (3600, None, 48)  # the data the command makes first
