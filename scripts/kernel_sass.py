"""The generated batch-norm kernels compiled for the H200 on a machine without a
GPU: registers, spills, and how many global loads each loop issues together.

Why: a generated kernel's speed on the device often comes down to what ptxas
made of it, and that can be read without a GPU. Reading it showed, for example,
that ptxas issued the second step of a ``plan.ROW_LOAD_BYTES`` loop only after
the first step's arithmetic (one load in flight, as with one step) until the
kernel declared its occupancy (``docs/performance.md``, "rows in flight").

For each of ``gpu_codegen_bench.py``'s cases (a model's batch-norm shapes:
statistics, backward sums, apply + ReLU, dx) and each ``--row-bytes`` value,
every launch of the plan is compiled as the device would compile it, minus
CuPy: NVRTC to PTX for ``compute_90``, then ``ptxas -v`` for ``sm_90``
(registers, spill bytes), then ``cuobjdump -sass`` (``loads``: in the loop of
the kernel that issues the most, the global loads issued before its first
floating-point instruction; a loop is a backward branch and the code it jumps
back over). Each distinct kernel text is compiled once.

Needs NVIDIA's compiler wheels (no GPU, no CUDA install)::

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    python scripts/kernel_sass.py --dtype bfloat16 --row-bytes 0,32 [--model densenet121] [--json out.jsonl]

Without the last two wheels ``loads`` is left out (said once on standard
error). NVRTC and ptxas 12.x read PTX the CUDA 13 driver accepts; the device's
CuPy compiles with its own NVRTC, so register counts may differ by a few there.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_codegen_bench import MODELS, cases  # noqa: E402  (a sibling script)

#: ``/*05d0*/  @!P2 BRA 0x560 ;``: address, instruction (cuobjdump -sass)
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?(0x[0-9a-f]+)")
_FLOAT = re.compile(r"^(?:@!?U?P\w+\s+)?(FADD|FFMA|FMUL|HADD2|HFMA2|HMUL2|DADD|DFMA|DMUL)\b")


def parse_sass(text: str) -> list[tuple[int, str]]:
    """``[(address, instruction)]`` of a ``cuobjdump -sass`` listing."""
    return [(int(a, 16), ins) for a, ins in _SASS_LINE.findall(text)]


def loads_together(sass: list[tuple[int, str]]) -> int:
    """The most global loads a loop issues before its first floating-point
    instruction (module docstring); 0 when no loop loads."""
    best = 0
    for end, (address, ins) in enumerate(sass):
        target = _BRANCH.search(ins)
        if not target or int(target.group(1), 16) > address:
            continue  # not a backward branch
        start = next(i for i, (a, _) in enumerate(sass) if a >= int(target.group(1), 16))
        count = 0
        for _, body in sass[start:end]:
            if _FLOAT.search(body):
                break
            count += "LDG" in body
        best = max(best, count)
    return best


#: the folder under ``nvidia/`` -> the wheel that puts it there
WHEELS = {"cuda_nvrtc": "nvidia-cuda-nvrtc-cu12", "cuda_nvcc": "nvidia-cuda-nvcc-cu12"}


def _package_dir(name: str) -> str:
    """Where pip put NVIDIA's wheel for ``nvidia/<name>``, or an error naming the wheel."""
    for root in sys.path:
        found = glob.glob(os.path.join(root, "nvidia", name))
        if found:
            return found[0]
    raise SystemExit(f"kernel_sass: {WHEELS[name]} is not installed: pip install {' '.join(WHEELS.values())} "
                     "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def _tool_dir() -> str | None:
    """The folder holding both ``cuobjdump`` and ``nvdisasm`` (any ``nvidia/*/bin``), or None."""
    for root in sys.path:
        for folder in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin"))):
            if all(os.path.exists(os.path.join(folder, tool)) for tool in ("cuobjdump", "nvdisasm")):
                return folder
    return None


def _row_bytes(text: str) -> list[int]:
    """``--row-bytes``: comma-separated whole numbers of bytes, each 0 or more."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"a byte count is 0 or more, got {text!r}")
    return values


class Compiler:
    """NVRTC (through ctypes), ptxas and, where installed, cuobjdump."""

    def __init__(self):
        lib = sorted(glob.glob(os.path.join(_package_dir("cuda_nvrtc"), "lib", "libnvrtc.so.*")))
        if not lib:
            raise SystemExit("kernel_sass: no libnvrtc.so in the cuda_nvrtc wheel")
        self.nvrtc = ctypes.CDLL(lib[0])
        self.ptxas = os.path.join(_package_dir("cuda_nvcc"), "bin", "ptxas")
        bin_dir = _tool_dir()
        self.cuobjdump = os.path.join(bin_dir, "cuobjdump") if bin_dir else None
        self.env = {**os.environ, "NVDISASM_PATH": bin_dir or ""}
        self._done: dict[str, dict] = {}

    def ptx(self, source: str) -> str:
        n = self.nvrtc
        prog = ctypes.c_void_p()
        if n.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None):
            raise RuntimeError("nvrtcCreateProgram failed")
        try:
            opts = (ctypes.c_char_p * 2)(b"--gpu-architecture=compute_90", b"-std=c++17")
            if n.nvrtcCompileProgram(prog, 2, opts):
                size = ctypes.c_size_t()
                n.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                n.nvrtcGetProgramLog(prog, log)
                raise RuntimeError(f"NVRTC rejected the kernel:\n{log.value.decode()}")
            size = ctypes.c_size_t()
            n.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            n.nvrtcGetPTX(prog, ptx)
            return ptx.value.decode()
        finally:
            n.nvrtcDestroyProgram(ctypes.byref(prog))

    def compile(self, source: str) -> dict:
        """``registers``, ``spill_bytes`` and (with cuobjdump) ``loads`` of one kernel
        (each distinct source compiled once)."""
        if source not in self._done:
            self._done[source] = self._compile(source)
        return dict(self._done[source])

    def _compile(self, source: str) -> dict:
        with tempfile.TemporaryDirectory() as d:
            ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
            with open(ptx, "w") as f:
                f.write(self.ptx(source))
            info = subprocess.run([self.ptxas, "-v", "-arch=sm_90", ptx, "-o", cubin],
                                  capture_output=True, text=True, check=True).stderr
            out = {"registers": int(re.search(r"Used (\d+) registers", info).group(1)),
                   "spill_bytes": sum(int(b) for b in re.findall(r"(\d+) bytes spill stores", info))}
            if self.cuobjdump:
                sass = subprocess.run([self.cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True,
                                      env=self.env)
                out["loads"] = loads_together(parse_sass(sass.stdout))
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Needs: pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12 "
                                        "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (no GPU)")
    ap.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--layout", default="NHWC", choices=["NCHW", "NHWC"])
    ap.add_argument("--row-bytes", type=_row_bytes, default=[0, 32],
                    help="ROW_LOAD_BYTES values, comma-separated (default 0,32)")
    ap.add_argument("--json", type=argparse.FileType("w"), help="also write one JSON object per kernel to this file")
    args = ap.parse_args(argv)
    from opgraph.backends.cuda.codegen import plan

    compiler = Compiler()
    if compiler.cuobjdump is None:
        print("kernel_sass: no cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm): "
              "'loads' left out", file=sys.stderr)
    batch, shapes = MODELS[args.model]
    default = plan.ROW_LOAD_BYTES
    try:
        for case in cases(batch, args.dtype, args.layout, [(*s[:3], 0) for s in shapes]):
            for row_bytes in args.row_bytes:
                plan.ROW_LOAD_BYTES = row_bytes
                lowered = plan.lower(case["op"], case["types"], case["out"])
                for launch in lowered.launches:
                    line = json.dumps({"kernel": case["name"], "shape": case["shape"], "row_bytes": row_bytes,
                                       "launch": launch.name.split("_")[2], **compiler.compile(launch.source)})
                    print(line, flush=True)
                    if args.json:
                        args.json.write(line + "\n")
    except BrokenPipeError:  # | head
        sys.stdout = None
    finally:
        plan.ROW_LOAD_BYTES = default
        if args.json:
            args.json.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
