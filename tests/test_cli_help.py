"""Help that teaches: every subcommand's `--help` ends with examples, every option says what it does and its
default, `gdn-trt --version` names the installed package; `gdn-trt build` takes the builder flags TensorRT users know
(trtexec, Polygraphy, TensorRT-LLM's names) and they reach Polygraphy's `CreateConfig` and `EngineFromNetwork`
(checked on the arguments those loaders get: no TensorRT here, so nothing is built)."""

from __future__ import annotations

import argparse
import enum
import types
from importlib.metadata import version
from pathlib import Path

import pytest

from gdn_trt.app import cli
from gdn_trt.export import cli as export_cli
from gdn_trt.export.build import PREVIEW_FEATURES, BuilderTuning, create_config
from gdn_trt.export.cliargs import Help

COMMANDS = ("export", "build", "refit", "compare", "budget")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    p = cli.parser()
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_with_its_default_and_the_command_has_examples(command, capsys):
    sub = _subparsers()[command]
    required_groups = {id(a) for g in sub._mutually_exclusive_groups if g.required for a in g._group_actions}
    for a in sub._actions:
        if isinstance(a, argparse._HelpAction) or not a.option_strings:
            continue
        assert a.help, f"{command} {a.option_strings[0]} has no help"
        if a.required or id(a) in required_groups or isinstance(a.default, bool):
            continue  # must be given, or a flag that is off unless given
        shown = Help(sub.prog)._get_help_string(a) % {"default": a.default}
        assert "default" in shown, f"{command} {a.option_strings[0]}: {shown!r} does not say its default"
    text = _help([command, "--help"], capsys)
    assert "examples:" in text and f"gdn-trt {command if command != 'budget' else 'plan'} " in text


def test_selftest_help_has_examples(capsys):
    text = _help(["selftest", "--help"], capsys)
    assert "examples:" in text and "--steps" in text and "(default: 50)" in text


def test_version_and_top_level_help(capsys):
    assert _help(["--version"], capsys).strip() == f"gdn-trt {version('gdn-trt')}"
    text = _help(["--help"], capsys)
    for line in ("gdn-trt export --preset tiny-3.5", "gdn-trt compare --onnx", "gdn-trt build --onnx",
                 "gdn-trt selftest", "exit codes:", "--help` shows each command's options"):
        assert line in text, line


def _args(argv: list[str]) -> argparse.Namespace:
    return cli.parser().parse_args(argv)


def test_tensorrt_llm_names_are_aliases_of_the_export_limits():
    for argv in (["--max-batch-size", "5", "--max-input-len", "96", "--max-draft-len", "3"],
                 ["--max_batch_size", "5", "--max_input_len", "96", "--max_draft_len", "3"],
                 ["--max-seqs", "5", "--max-num-tokens", "96", "--max-draft", "3"]):
        a = _args(["export", "--preset", "tiny-3.5", *argv])
        assert (a.max_seqs, a.max_tokens, a.max_draft) == (5, 96, 3), argv
    b = _args(["build", "--max_batch_size", "5", "--max-input-len", "96"])
    assert (b.max_seqs, b.max_tokens, b.max_draft) == (5, 96, None)


def _standin_trt():
    """The TensorRT names `create_config` reads (enums only): it builds nothing."""
    return types.SimpleNamespace(__version__="10.13.0",
                                 PreviewFeature=enum.Enum("PreviewFeature", PREVIEW_FEATURES),
                                 MemoryPoolType=enum.Enum("MemoryPoolType", ("WORKSPACE", "TACTIC_SHARED_MEMORY")))


@pytest.mark.parametrize("flags, pools", [
    (["--workspace", "4G"], {"WORKSPACE": 4 << 30}),
    (["--pool-limit", "workspace:512M", "tactic_shared_memory:48K"], {"WORKSPACE": 512 << 20,
                                                                      "TACTIC_SHARED_MEMORY": 48 << 10}),
    (["--memPoolSize", "workspace:2048,tactic_shared_memory:1K"], {"WORKSPACE": 2048 << 20,
                                                                   "TACTIC_SHARED_MEMORY": 1 << 10}),
    (["--memory-pool-limit", "workspace:1e9"], {"WORKSPACE": 10 ** 9}),
], ids=["workspace", "polygraphy", "trtexec-mib", "polygraphy-alias"])
def test_build_flags_reach_polygraphy_create_config(flags, pools, tmp_path):
    from polygraphy.backend.trt import EngineFromNetwork

    cache = tmp_path / "timing.cache"
    args = _args(["build", "--onnx", str(tmp_path), *flags, "--timingCacheFile", str(cache),
                  "--builderOptimizationLevel", "5", "--refittable"])
    opts = export_cli.build_options(args, tmp_path / "plans")
    assert opts.out == tmp_path / "plans" and opts.refittable and opts.tuning.optimization_level == 5
    trt = _standin_trt()
    config = create_config(trt, ["profile 0"], opts.refittable, opts.tuning)
    assert {k.name: v for k, v in config.memory_pool_limits.items()} == pools
    assert config.builder_optimization_level == 5 and config.timing_cache_path == str(cache)
    assert config.refittable and config.profiles == ["profile 0"]
    assert config.preview_features == [trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03]
    loader = EngineFromNetwork(network=None, config=config, **opts.tuning.engine_args())
    assert loader.timing_cache_path == str(cache)  # saved (merged) after each build


def test_default_build_leaves_tensorrt_defaults(tmp_path):
    opts = export_cli.build_options(_args(["build", "--onnx", str(tmp_path)]), tmp_path)
    assert opts.tuning == BuilderTuning()
    config = create_config(_standin_trt(), [], False, opts.tuning)
    assert config.memory_pool_limits is None and config.builder_optimization_level is None
    assert config.timing_cache_path is None and opts.tuning.engine_args() == {"save_timing_cache": None}


def test_an_unknown_memory_pool_is_named():
    with pytest.raises(ValueError, match="memory pool 'dlasram' is not a trt.MemoryPoolType"):
        BuilderTuning((("dlasram", 1),)).config_args(_standin_trt())


def test_plans_go_where_out_says():
    assert export_cli.plans_dir(Path("x"), "m", several=False) == Path("x")
    assert export_cli.plans_dir(Path("x"), "m", several=True) == Path("x/m")
    assert export_cli.plans_dir(None, "m", several=False) == Path("engines/m")
