"""``scripts/copy_bench.py`` without a GPU: its shapes are the classifiers' ``Flatten`` inputs of
the models it names (read from the built graphs), both directions of each take the tiled copy,
``--help`` and argument errors are clean exits, without CuPy it says why and exits 2, and a whole
run on a stand-in for CuPy (the kernels through the g++ emulator, the clock stubbed) checks every
way correct and writes every line."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from opgraph.backends.cuda.codegen import copies
from opgraph.benchmarks.models import build
from opgraph.op import abstract_of
from opgraph import ops

from repo_scripts import load_script

#: the batch each model's shape is at (the profile's, and opgraph-bench's default)
BATCH = {"alexnet": 128, "overfeat": 128, "vgg_a": 64}


@pytest.mark.parametrize("model", sorted(BATCH))
def test_the_shapes_are_the_flatten_inputs_of_the_models(model):
    shape = load_script("copy_bench").SHAPES[model][0]
    graph = build(model, batch=BATCH[model])
    flattened = [tuple(v.inputs[0].type.shape) for v in graph.output.graph.nodes_in_order([graph.output])
                 if isinstance(abstract_of(v.op), ops.Flatten)]
    assert flattened == [shape]


@pytest.mark.parametrize("model", sorted(BATCH))
def test_both_directions_take_the_tiled_copy(model):
    n, c, h, w = load_script("copy_bench").SHAPES[model][0]
    nhwc = np.empty((n, h, w, c), np.uint16).transpose(0, 3, 1, 2)
    c_order = np.empty((n, c, h, w), np.uint16)
    for dst, src in ((c_order, nhwc), (nhwc, c_order)):
        name = copies._plan(dst.shape, copies._element_strides(dst), src.shape, copies._element_strides(src),
                            (0,) * 4, 2, 0, True, True)[0]
        assert name.startswith("opgraph_gen_copy_t_")


def test_help_is_a_clean_exit(capsys):
    with pytest.raises(SystemExit) as e:
        load_script("copy_bench").main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--models" in out and "--repeat" in out


@pytest.mark.parametrize("argv, message", [
    (["--models", "alexnt"], "--models 'alexnt': give some of alexnet, overfeat, vgg_a"),
    (["--models", ","], "--models ',': give some of"),
    (["--calls", "0"], "--calls 0: must be at least 1"),
    (["--warmup", "-1"], "--warmup -1: must be 0 or more"),
    (["--repeat", "20"], "--repeat 20: must be at least 50"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    ([], "it times CUDA kernels: it needs an NVIDIA GPU and CuPy"),
])
def test_bad_arguments_and_no_cupy_are_one_line_errors(capsys, monkeypatch, argv, message):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError, GPU or not
    with pytest.raises(SystemExit) as e:
        load_script("copy_bench").main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err


def test_arguments_parse_to_their_defaults():
    _, args = load_script("copy_bench").parse([])
    assert (args.models, args.dtype, args.calls, args.warmup, args.repeat) == (
        ["alexnet", "overfeat", "vgg_a"], "bfloat16", 20, 3, 100)
    _, args = load_script("copy_bench").parse(["--models", "vgg_a, overfeat", "--repeat", "50"])
    assert args.models == ["vgg_a", "overfeat"] and args.repeat == 50
    assert load_script("copy_bench").quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)


def test_a_run_on_the_emulated_kernels(monkeypatch, capsys, tmp_path):
    """The whole script on a stand-in for ``cupy`` (NumPy arrays, the generated kernels through
    the g++ emulator, copies.py's plan caches emptied), at small shapes with edge tiles: every
    way checked correct, the JSON lines complete; the timing stubbed (no GPU)."""

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent / "backends"))  # the emulator's helpers
    from codegen_emulated import codegen_emulated
    from cuda_cpu_emulator import GXX, EmulatedCupy
    if GXX is None:
        pytest.skip("no g++: the kernels' CUDA text cannot run on the CPU")

    class StandIn(EmulatedCupy):
        """``cupy`` for the script: NumPy's arrays and functions, the emulator's RawModule."""

        def __getattr__(self, name):
            return getattr(np, name)

    bench = load_script("copy_bench")
    monkeypatch.setattr(bench, "SHAPES", {"small": ((2, 40, 3, 5), 0.001, 0.002), "edges": ((3, 33, 7, 7), 0, 0)})
    monkeypatch.setattr(bench, "memcpy", lambda cp, dst, src: np.copyto(dst, src.reshape(-1)))
    calls = []

    def replayed(fn, n, *, warmup, repeat):
        calls.append(n)
        fn()
        return [0.001 * (1 + k % 3) for k in range(repeat)]
    monkeypatch.setattr(bench, "replayed_times_per_call", replayed)
    monkeypatch.setattr("opgraph.backends.copy_bandwidth.measure_copy_bandwidth", lambda device: {"gbps": 4000.0})
    monkeypatch.setattr("opgraph.backends.device.cuda_status", lambda: (True, "a stand-in"))
    with codegen_emulated(monkeypatch, StandIn()) as emu:
        assert bench.main(["--json", str(tmp_path / "out.jsonl")]) == 0
        tiled = [x["name"].startswith("opgraph_gen_copy_t_") for x in emu.raw_launches]
    assert tiled.count(True) == tiled.count(False) == 8  # each direction of 2 shapes: checked, then "timed"
    assert copies.TILED is True and calls == [20] * 16
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines == [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    rows = [x for x in lines if x["what"] == "copy"]
    assert len(rows) == 16 and all(x["correct"] for x in rows if x["way"] != "memcpy")
    assert rows[0]["ms"] == 0.002 and rows[0]["iqr_ms"] == [0.001, 0.003] and rows[0]["of_memcpy"] == 1.0
    assert lines[-1]["what"] == "summary" and lines[-1]["correct"] is True
