"""Every `gdn-trt` subcommand refuses a bad argument or path with one line on stderr and a non-zero exit, before it
writes anything, and never with a traceback; `Session.open` on a device this machine lacks raises `DeviceError`
before it allocates anything."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gdn_trt.app import cli
from gdn_trt.model.checkpoint import make_synthetic_checkpoint
from gdn_trt.model.errors import GdnTrtError

from .conftest import has_tensorrt


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_synthetic_checkpoint("tiny-3.5", tmp_path_factory.mktemp("cli") / "ck", seed=0)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's exits (bad argument: 2)
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


# (argv, the words the line must hold); {tmp} is a fresh folder that must stay empty, {ck} a real checkpoint
CASES = [
    (["export", "--preset", "nope"], "unknown preset 'nope'"),
    (["export", "--checkpoint", "/nonexistent"], "/nonexistent is not a directory"),
    (["export", "--checkpoint", "{tmp}"], "has no config.json"),
    (["export", "--preset", "tiny-3.5", "--layers", "7", "--out", "{tmp}/x"], "layers [7] are not GDN layers"),
    (["export", "--preset", "tiny-3.5", "--layers", "x", "--out", "{tmp}/x"], "give all, variants or layer"),
    (["export", "--preset", "tiny-3.5", "--adapter", "/nonexistent", "--out", "{tmp}/x"], "is not a directory"),
    (["export", "--preset", "tiny-3.5", "--adapter", "{tmp}", "--out", "{tmp}/x"], "no adapter_config.json"),
    (["export", "--preset", "tiny-3.5", "--modes", "nope"], "modes are decode,"),
    (["export", "--preset", "tiny-3.5", "--max-seqs", "0"], "0 is not a positive integer"),
    (["export", "--preset", "tiny-3.5", "--max-seqs", "32", "--out", "{tmp}/x"], "must hold max_seqs"),
    (["export", "--preset", "tiny-3.5", "--lora-slots", "2", "--lora-targets", "nope", "--out", "{tmp}/x"],
     "unknown targets ['nope']"),
    (["export", "--checkpoint", "{ck}", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["compare", "--onnx", "/nonexistent"], "/nonexistent is not a directory"),
    (["compare", "--onnx", "{tmp}"], "no manifest.json here"),
    (["compare", "--onnx", "{tmp}", "--iterations", "-1"], "-1 is not a positive integer"),
    (["compare", "--onnx", "{tmp}", "--device", "tpu"], "device 'tpu'"),
    (["plan", "--preset", "tiny-3.5", "--max-seqs", "-3"], "-3 is not a positive integer"),
    (["plan", "--preset", "tiny-3.5", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["budget", "--preset", "nope"], "unknown preset 'nope'"),
    (["budget", "--checkpoint", "/nonexistent"], "/nonexistent is not a directory"),
    (["budget", "--preset", "tiny-3.5", "--device-memory", "80XB"], "'80XB' is not a size"),
    (["budget"], "one of the arguments --preset --checkpoint is required"),
    (["build", "--onnx", "/nonexistent"], "/nonexistent is not a directory"),
    (["build", "--onnx", "{tmp}"], "no manifest.json here"),
    (["build", "--onnx", "{tmp}", "--workspace", "lots"], "'lots' is not a size"),
    (["build", "--onnx", "{tmp}", "--builder-optimization-level", "9"], "9 is not a builder optimization level"),
    (["build", "--onnx", "{tmp}", "--pool-limit", "workspace"], "write POOL:SIZE"),
    (["refit", "--onnx", "/nonexistent"], "/nonexistent is not a directory"),
    (["refit"], "the following arguments are required: --onnx"),
    (["refit", "--onnx", "{tmp}"], "no manifest.json here"),
    (["selftest", "--bogus"], "unrecognized arguments: --bogus"),
    (["selftest", "--steps", "0"], "0 is not a positive integer"),
    (["nope"], "invalid choice: 'nope'"),
    ([], "the following arguments are required: COMMAND"),
]


@pytest.mark.parametrize("argv, words", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_bad_argument_or_path_is_one_line_and_a_nonzero_exit(argv, words, ckpt, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path, ck=ckpt) for a in argv]
    rc, out, err = _run(argv, capsys)
    assert rc not in (0, None), (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert words in lines[0] and lines[0].startswith("gdn-trt"), lines[0]
    assert list(tmp_path.iterdir()) == [], "a refused command must not write anything"


def test_build_limits_must_be_the_exports(tmp_path, capsys):
    """TensorRT-LLM's names on build check the export's limits (they fix the graphs' shapes)."""
    (tmp_path / "manifest.json").write_text('{"model": "m", "limits": {"max_seqs": 8, "max_tokens": 256, '
                                            '"max_draft": 4}, "graphs": []}')
    rc, _, err = _run(["build", "--onnx", str(tmp_path), "--max_batch_size", "64"], capsys)
    assert rc == 1 and err.count("\n") == 1
    assert "exported with max_seqs = 8, not 64" in err and "--max-seqs (--max-batch-size) 64" in err


def test_the_installed_command_prints_no_traceback(tmp_path):
    """The console script's module, as a process: exit code and stderr as a user sees them."""
    for argv, code in ((["export", "--preset", "nope"], 2), (["compare", "--onnx", str(tmp_path)], 1)):
        p = subprocess.run([sys.executable, "-m", "gdn_trt.app.cli", *argv], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == code and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr


def test_an_unexpected_error_is_one_line_that_points_to_the_traceback(capsys, monkeypatch):
    from gdn_trt.export import cliargs

    def boom(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.delenv(cliargs.TRACEBACK_ENV, raising=False)
    rc = cliargs.run(type("A", (), {"func": staticmethod(boom)})(), "gdn-trt x")
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "unexpected ZeroDivisionError" in err
    assert f"{cliargs.TRACEBACK_ENV}=1" in err
    monkeypatch.setenv(cliargs.TRACEBACK_ENV, "1")
    with pytest.raises(ZeroDivisionError):
        cliargs.run(type("A", (), {"func": staticmethod(boom)})(), "gdn-trt x")


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="this machine has CUDA, so the missing-CUDA error cannot occur; CPU machines and CI run it")
def test_session_on_cuda_without_cuda_is_a_device_error_before_any_allocation(monkeypatch):
    from gdn_trt.model.devices import DeviceError
    from gdn_trt.runtime import Session, session

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the device was checked")

    monkeypatch.setattr(session, "load_source", no_load)
    for device in ("cuda", "cuda:1", "gpu", "mps"):
        with pytest.raises(DeviceError) as e:
            Session.open("tiny-3.5", device=device)
        assert isinstance(e.value, GdnTrtError) and isinstance(e.value, RuntimeError)
        assert repr(device) in str(e.value) and "\n" not in str(e.value)
    assert "use device='cpu'" in str(pytest.raises(DeviceError, Session.open, "tiny-3.5", device="cuda").value)


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed, so the missing-TensorRT error cannot occur; "
                    "machines without it and CI run it, and test_selftest.py runs the build where it is")
def test_a_missing_tensorrt_is_exit_2_and_one_line(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"model": "m", "limits": {}, "graphs": []}')
    for argv in (["build", "--onnx", str(tmp_path)], ["selftest"]):
        rc, _, err = _run(argv, capsys)
        assert rc == 2 and err.count("\n") == 1 and "TensorRT >= 10.8" in err, err
