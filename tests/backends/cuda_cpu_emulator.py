"""Our CuPy element-wise kernels run on the CPU: a stand-in for ``cupy`` whose
``ElementwiseKernel`` compiles the kernel's own CUDA text (type typedefs,
preamble, body) as C++ with g++ and runs it over NumPy arrays, one loop
iteration per CUDA thread, as CuPy would lay the kernel out:

* ``raw`` parameters are pointers to the C-contiguous data (``x[j]``);
  other array parameters are the loop element (``const T& x`` for inputs,
  ``T& y`` for outputs) of the arrays broadcast to the loop shape; scalars
  are ``const`` values of the declared type;
* placeholder types (``T``, ``G``, ``A``...) are bound from the arrays
  passed; a placeholder bound twice to different types or a bfloat16 array
  (CuPy has no C type for it: our kernels must get its uint16 bits) raises
  TypeError; float16 is the compiler's half type (:data:`C_TYPES`);
* ``i`` is the loop index; ``size=`` gives the loop length when every array
  is raw.

The CUDA intrinsics our sources use (``__float_as_uint``, ``__uint_as_float``)
are defined bit-exactly; ``exp``/``log``/``pow`` are the C++ ones (float
overloads for float, as CUDA's). Each kernel source is also recorded in CUDA
form (:attr:`EmulatedCupy.cuda_sources`), so a test can compile exactly what
ran with nvcc (:func:`nvcc_check`).

No GPU and no CuPy are needed; tests using this module skip without g++.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

GXX = shutil.which("g++")
NVCC = shutil.which("nvcc")

#: numpy dtype name -> C type, as CuPy names them (bfloat16 absent: CuPy has
#: no C type for it). float16 is CuPy's ``float16`` class, here the compiler's
#: half type (``_Float16`` in g++, ``__half`` in nvcc), which like CuPy's
#: compares and computes through float.
C_TYPES = {"float64": "double", "float32": "float", "float16": "float16", "int64": "long long", "int32": "int",
           "int16": "short", "int8": "signed char", "uint64": "unsigned long long", "uint32": "unsigned int",
           "uint16": "unsigned short", "uint8": "unsigned char", "bool": "bool"}

_CPU_PRELUDE = r"""
#include <cmath>
#include <cstring>
using std::exp; using std::log; using std::pow; using std::sqrt; using std::fabs;
#define __device__
#define __forceinline__ inline
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
// rounded on their own, never contracted into an FMA (a test compiles with -ffp-contract=fast)
static inline float __fmul_rn(float a, float b) { volatile float p = a * b; return p; }
static inline double __dmul_rn(double a, double b) { volatile double p = a * b; return p; }
typedef _Float16 float16;
"""

_PARAM = re.compile(r"^(raw\s+)?(\w+)\s+(\w+)$")

_WORKDIR = None
_LIBS: dict = {}


def parse_params(text: str):
    """``'raw T x, int64 C'`` -> ``[(True, 'T', 'x'), (False, 'int64', 'C')]``."""
    out = []
    for part in text.split(","):
        m = _PARAM.match(part.strip())
        if not m:
            raise ValueError(f"cannot parse kernel parameter {part!r}")
        out.append((bool(m.group(1)), m.group(2), m.group(3)))
    return out


def _workdir() -> str:
    global _WORKDIR
    if _WORKDIR is None:
        _WORKDIR = tempfile.mkdtemp(prefix="opgraph_cpu_kernels_")
        atexit.register(shutil.rmtree, _WORKDIR, True)
    return _WORKDIR


#: entry point -> (argument types, result type) of the compiled library's function.
_ENTRIES = {"opgraph_cpu_kernel": ([ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong], None),
            "og_launch": ([ctypes.POINTER(ctypes.c_void_p)] + [ctypes.c_uint] * 6, ctypes.c_int)}


#: g++ flags of every emulated kernel (a precompiled header must be built with the same).
GXX_FLAGS = ["-O1", "-std=c++17", "-fno-strict-aliasing", "-fPIC"]


def precompiled_header(name: str, text: str) -> str:
    """Write header ``name`` holding ``text`` into the work folder and precompile it
    (once per process: g++ then reads the ``.gch`` instead of parsing the
    standard headers again for every kernel). Returns the folder, for ``-I``."""
    path = os.path.join(_workdir(), name)
    if not os.path.exists(path + ".gch"):
        with open(path, "w") as f:
            f.write(text)
        subprocess.run([GXX, *GXX_FLAGS, "-x", "c++-header", "-o", path + ".gch", path], capture_output=True)
    return _workdir()


def _compile(source: str, entry: str = "opgraph_cpu_kernel", include: str | None = None):
    """The function ``entry`` (:data:`_ENTRIES`) of ``source`` compiled by g++, built once."""
    key = hashlib.sha1(source.encode()).hexdigest()[:20]
    if key not in _LIBS:
        base = os.path.join(_workdir(), f"k_{key}")
        with open(base + ".cpp", "w") as f:
            f.write(source)
        cmd = [GXX, *GXX_FLAGS, "-shared", *(["-I", include] if include else []), "-o", base + ".so",
               base + ".cpp"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"g++ rejected the kernel:\n{done.stderr[-4000:]}\n--- source ---\n{source}")
        fn = getattr(ctypes.CDLL(base + ".so"), entry)
        fn.argtypes, fn.restype = _ENTRIES[entry]
        _LIBS[key] = fn
    return _LIBS[key]


def kernel_text(params, n_in, kinds, types, preamble, body, cuda: bool) -> str:
    """The kernel as one translation unit: C++ with a serial loop (``cuda``
    False) or CUDA with a grid-stride loop. ``kinds[k]`` is 'raw', 'array' or
    'scalar'; ``types`` maps placeholders to C types."""
    lines = ["typedef __half float16;  // cuda_fp16.h: included by one_unit"] if cuda else [_CPU_PRELUDE]
    lines += [f"typedef {c} {p};" for p, c in types.items()]
    lines.append(preamble)
    if cuda:
        lines.append('extern "C" __global__ void opgraph_cuda_kernel(void** _a, long long _n) {')
        lines.append("  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < _n;"
                     " i += (long long)blockDim.x * gridDim.x) {")
    else:
        lines.append('extern "C" void opgraph_cpu_kernel(void** _a, long long _n) {')
        lines.append("  for (long long i = 0; i < _n; ++i) {")
    for k, ((_, typ, name), kind) in enumerate(zip(params, kinds)):
        c = types.get(typ) or C_TYPES[typ]
        if kind == "raw":
            lines.append(f"    {c}* const {name} = ({c}*)_a[{k}];")
        elif kind == "array":
            ref = "" if k >= n_in else "const "
            lines.append(f"    {ref}{c}& {name} = (({c}*)_a[{k}])[i];")
        else:
            lines.append(f"    const {c} {name} = *(const {c}*)_a[{k}];")
    lines.append("    { " + body + "; }")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


class EmulatedKernel:
    def __init__(self, owner, in_params, out_params, operation, name, preamble):
        self.owner, self.name, self.preamble, self.body = owner, name, preamble, operation
        self.in_params, self.out_params = in_params, out_params
        self.params = parse_params(in_params) + parse_params(out_params)
        self.n_in = len(parse_params(in_params))

    def __call__(self, *args, size=None):
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.params)} parameters")
        types, kinds = {}, []
        for (raw, typ, name), a in zip(self.params, args):
            if isinstance(a, np.ndarray):
                kinds.append("raw" if raw else "array")
                if typ not in C_TYPES:  # a placeholder
                    if a.dtype.name not in C_TYPES:
                        raise TypeError(f"{self.name}: no C type for {a.dtype.name} (parameter {name})")
                    c = C_TYPES[a.dtype.name]
                    if types.setdefault(typ, c) != c:
                        raise TypeError(f"{self.name}: {typ} is both {types[typ]} and {c}")
            else:
                if raw or typ not in C_TYPES:
                    raise TypeError(f"{self.name}: scalar {a!r} for parameter {typ} {name}")
                kinds.append("scalar")
        arrays = [a for a, k in zip(args, kinds) if k == "array"]
        if size is None:
            if not arrays:
                raise ValueError(f"{self.name}: loop size unknown (every argument raw)")
            shape = np.broadcast_shapes(*(a.shape for a in arrays))
            n = int(np.prod(shape))
        else:
            if arrays:
                raise ValueError(f"{self.name}: size= with non-raw array arguments")
            n = int(size)
        keep, ptrs, back = [], [], []
        for k, ((raw, typ, name), a, kind) in enumerate(zip(self.params, args, kinds)):
            out = k >= self.n_in
            if kind == "scalar":
                buf = np.asarray(a, dtype="bool" if typ == "bool" else typ)
            else:
                want = a.dtype if typ not in C_TYPES else np.dtype(typ)
                if out and a.dtype != want:
                    raise TypeError(f"{self.name}: output {name} is {a.dtype}, declared {typ}")
                src = a.view(np.ndarray)
                if kind == "array":
                    if out and src.shape != shape:
                        raise ValueError(f"{self.name}: output {name} has shape {src.shape}, loop {shape}")
                    src = np.broadcast_to(src, shape)
                buf = np.ascontiguousarray(src, dtype=want)
                if out and not np.shares_memory(buf, a):
                    back.append((a, buf))
            keep.append(buf)
            ptrs.append(buf.ctypes.data)
        source = kernel_text(self.params, self.n_in, kinds, types, self.preamble, self.body, cuda=False)
        self.owner.cuda_sources[self.name, tuple(kinds), tuple(types.items())] = kernel_text(
            self.params, self.n_in, kinds, types, self.preamble, self.body, cuda=True)
        self.owner.launches.append(dict(name=self.name, types=dict(types), n=n, preamble=self.preamble,
                                        body=self.body, args=args))
        if n and self.owner.run:
            _compile(source)((ctypes.c_void_p * len(ptrs))(*ptrs), n)
        for a, buf in back:
            a[...] = buf
        outs = args[self.n_in:]
        return outs[0] if len(outs) == 1 else outs


class EmulatedCupy:
    """Stands in for ``cupy`` where our modules import it (kernel construction
    only; the arrays are NumPy's, ``xp`` is ``numpy``). With ``run=False`` the
    kernels are recorded, not compiled or run (outputs stay uninitialised).
    ``RawModule`` / ``RawKernel`` launches run through ``cuda_raw_emulator``
    (recorded in ``raw_launches``, their sources in ``raw_sources``)."""

    def __init__(self, run=True):
        self.run = run
        self.launches = []
        self.cuda_sources = {}
        self.raw_launches, self.raw_sources = [], []

    def RawModule(self, code, options=(), **kwargs):
        from cuda_raw_emulator import raw_module
        return raw_module(self, code)

    def RawKernel(self, code, name, options=(), **kwargs):
        return self.RawModule(code).get_function(name)

    def ElementwiseKernel(self, in_params, out_params, operation, name="kernel", preamble="", **options):
        return EmulatedKernel(self, in_params, out_params, operation, name, preamble)


_ENTRY = re.compile(r'extern "C" __global__ void ((?:__launch_bounds__\([^)]*\) )?)(\w+)\(')


def one_unit(sources) -> str:
    """CUDA sources (each a whole NVRTC module) as one translation unit, so
    that nvcc runs once: each in its own namespace, its kernels renamed
    ``<name>__<k>`` (C linkage ignores namespaces), the LD/ST/CT macros
    undefined after it; ``cuda_fp16.h`` (float16) included once, first."""
    parts = ["#include <cuda_fp16.h>\n"]
    for k, src in enumerate(sources):
        body = _ENTRY.sub(rf'extern "C" __global__ void \1\2__{k}(', src)
        parts.append(f"namespace opgraph_unit_{k} {{\n{body}\n}}  // opgraph_unit_{k}\n"
                     "#undef CT\n#undef LD\n#undef ST\n")
    return "".join(parts)


def nvcc_check(sources, arch="sm_90"):
    """Compile CUDA sources (:func:`one_unit`) with ``nvcc -ptx`` (no GPU
    needed); raise with the compiler's message if rejected. Returns the PTX."""
    with tempfile.TemporaryDirectory(prefix="opgraph_nvcc_") as d:
        path = os.path.join(d, "kernels.cu")
        with open(path, "w") as f:
            f.write(one_unit(sources))
        done = subprocess.run([NVCC, "-ptx", f"-arch={arch}", "-o", path[:-3] + ".ptx", path], cwd=d,
                              capture_output=True, text=True)
        if done.returncode:
            raise AssertionError(f"nvcc rejected a kernel:\n{done.stderr[-6000:]}")
        with open(path[:-3] + ".ptx") as f:
            return f.read()
