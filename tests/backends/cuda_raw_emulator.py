"""CuPy ``RawModule`` / ``RawKernel`` launches run on the CPU: the kernel's own
CUDA text compiled as C++ with g++, every CUDA thread run in turn.

A launch ``kernel(grid, block, args)`` runs block after block (x fastest, as
``blockIdx``); inside a block, threads run in ``threadIdx`` order. A kernel
without ``__syncthreads`` runs each thread to its end in turn. One that
synchronises runs its threads as coroutines (``ucontext``): each runs until
its next ``__syncthreads`` (or its end), then the next thread; when all have
arrived the round repeats, so shared memory (``__shared__``, a static of the
block) is written and read as on the GPU. A thread that ends while others wait
at a barrier is reported (a divergent ``__syncthreads`` hangs a real GPU).

Arguments are checked against the kernel's signature (the C type of every
scalar; the element type of every pointer: ``float`` float32, ``double``
float64, ``unsigned short`` the uint16 bits of bfloat16/float16). Each
array's owner (the array a view was taken from) runs inside a guarded copy
(0xFF bytes on both sides, a NaN in every float format): a read outside it
shows up as NaN in the results, and a write outside it fails the launch.
Views of one owner (an in-place output, a concat's channel slices) share one
copy. CUDA intrinsics the generated sources use are
defined bit-exactly (``__umulhi``, ``__uint_as_float``, ``__hiloint2double``,
...); ``OPGRAPH_CPU`` selects the C++ float16 conversions (``_Float16``).
"""

from __future__ import annotations

import ctypes
import re

import numpy as np

from cuda_cpu_emulator import _compile, precompiled_header

#: The standard headers of every emulated raw kernel, precompiled once per process.
HEADERS = "#include <cmath>\n#include <cstring>\n#include <vector>\n#include <ucontext.h>\n"

PRELUDE = r"""
#include "og_raw_headers.h"
using std::exp; using std::log; using std::pow; using std::sqrt; using std::fabs; using std::fmax;
using std::fmin; using std::erf; using std::tanh;
#define OPGRAPH_CPU 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
struct og_dim3 { unsigned int x, y, z; };
struct uint4 { unsigned int x, y, z, w; };
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
static og_dim3 threadIdx, blockIdx, blockDim, gridDim;
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
// rounded on their own, never contracted into an FMA (a test compiles with -ffp-contract=fast)
static inline float __fmul_rn(float a, float b) { volatile float p = a * b; return p; }
static inline double __dmul_rn(double a, double b) { volatile double p = a * b; return p; }
static inline double __hiloint2double(int hi, int lo) {
    unsigned long long u = ((unsigned long long)(unsigned int)hi << 32) | (unsigned int)lo;
    double d; std::memcpy(&d, &u, 8); return d;
}
static inline int __double2loint(double d) { unsigned long long u; std::memcpy(&u, &d, 8); return (int)(u & 0xffffffffu); }
static inline int __double2hiint(double d) { unsigned long long u; std::memcpy(&u, &d, 8); return (int)(u >> 32); }
static inline float opgraph_h2f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short opgraph_f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h; }
void __syncthreads();
// blocks run one after another and threads in turn: no other thread runs between
// a read and a write, so atomics are plain read-modify-writes and fences are empty
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { unsigned int old = *p; *p = old + v; return old; }
static inline void __threadfence() {}
template <class T> static inline T __ldcg(const T* p) { return *p; }
"""

LAUNCHER = r"""
static void** og_args;
static ucontext_t og_main;
static std::vector<ucontext_t> og_ctx;
static std::vector<int> og_state;  // 0 runnable, 1 at a barrier, 2 done
static int og_cur;
void __syncthreads() {
#if OG_SYNC
    og_state[og_cur] = 1;
    swapcontext(&og_ctx[og_cur], &og_main);
#endif
}
static void og_thread() { CALL; og_state[og_cur] = 2; }
static void og_set_thread(unsigned int t) {
    threadIdx.x = t % blockDim.x; threadIdx.y = (t / blockDim.x) % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}
extern "C" int og_launch(void** args, unsigned int gx, unsigned int gy, unsigned int gz,
                         unsigned int bx, unsigned int by, unsigned int bz) {
    og_args = args;
    gridDim = {gx, gy, gz}; blockDim = {bx, by, bz};
    const unsigned int threads = bx * by * bz;
    std::vector<char> stacks(OG_SYNC ? (size_t)threads * 65536 : 0);
    og_ctx.assign(threads, ucontext_t()); og_state.assign(threads, 0);
    for (unsigned int z = 0; z < gz; ++z) for (unsigned int y = 0; y < gy; ++y) for (unsigned int x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
        if (!OG_SYNC) { for (unsigned int t = 0; t < threads; ++t) { og_set_thread(t); og_cur = t; CALL; } continue; }
        for (unsigned int t = 0; t < threads; ++t) {
            getcontext(&og_ctx[t]);
            og_ctx[t].uc_stack.ss_sp = &stacks[(size_t)t * 65536];
            og_ctx[t].uc_stack.ss_size = 65536;
            og_ctx[t].uc_link = &og_main;
            makecontext(&og_ctx[t], og_thread, 0);
            og_state[t] = 0;
        }
        for (;;) {
            for (unsigned int t = 0; t < threads; ++t) {
                if (og_state[t] == 2) continue;
                og_set_thread(t); og_cur = t; og_state[t] = 0;
                swapcontext(&og_main, &og_ctx[t]);
            }
            unsigned int done = 0;
            for (unsigned int t = 0; t < threads; ++t) done += og_state[t] == 2;
            if (done == threads) break;
            if (done) return -1;  // some threads ended while others wait at __syncthreads
        }
    }
    return 0;
}
"""

#: C type of a scalar parameter -> NumPy scalar type and ctypes type.
SCALARS = {"long long": (np.int64, ctypes.c_longlong), "unsigned int": (np.uint32, ctypes.c_uint),
           "unsigned long long": (np.uint64, ctypes.c_ulonglong), "int": (np.int32, ctypes.c_int),
           "unsigned short": (np.uint16, ctypes.c_ushort), "unsigned char": (np.uint8, ctypes.c_ubyte),
           "float": (np.float32, ctypes.c_float), "double": (np.float64, ctypes.c_double)}
#: element type of a pointer parameter -> the NumPy dtypes whose buffer it may be
#: (a ``uint4`` pointer moves 16-byte words of any element type).
ELEMENTS = {"float": ("float32",), "double": ("float64",), "unsigned short": ("uint16",),
            "unsigned int": ("uint32",), "unsigned long long": ("uint64",), "unsigned char": ("uint8",),
            "long long": ("int64",), "int": ("int32",), "uint4": ("uint8", "uint16", "uint32", "uint64"),
            # colsum.py's bfloat16 struct of its 16 bits (the column and row kernels): its uint16 view
            "opgraph_bf16": ("uint16",)}
_TYPEDEF = re.compile(r"typedef ([\w ]+?) (\w+);")

_SIGNATURE = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\((.*?)\)\s*\{', re.S)
GUARD = 64


def parse_signature(source: str, name: str) -> list[tuple[str, str]]:
    """``[(C type, parameter name)]`` of kernel ``name`` in ``source`` (typedef names resolved)."""
    aliases = {alias: target for target, alias in _TYPEDEF.findall(source)}
    for found, params in _SIGNATURE.findall(source):
        if found == name:
            out = []
            for decl in (p.strip() for p in params.split(",") if p.strip()):
                decl = decl.replace("__restrict__", " ")
                ctype, pname = decl.rsplit(None, 1)
                words = [aliases.get(w, w) for w in ctype.replace("*", " * ").split()]
                out.append((" ".join(words).replace(" *", "*"), pname))
            return out
    raise KeyError(f"no kernel {name} in the source")


class EmulatedRawKernel:
    def __init__(self, owner, source: str, name: str):
        self.owner, self.source, self.name = owner, source, name
        self.signature = parse_signature(source, name)
        sync = "__syncthreads" in source
        call = f"{name}(" + ", ".join(f"*({ctype}*)og_args[{k}]" for k, (ctype, _) in
                                      enumerate(self.signature)) + ")"
        self.cpu_source = (PRELUDE + source + f"\n#define OG_SYNC {int(sync)}\n#define CALL {call}\n" + LAUNCHER)

    def __call__(self, grid, block, args, shared_mem=0):
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.signature)} parameters")
        self.owner.raw_launches.append(dict(name=self.name, grid=grid, block=block, args=args, source=self.source))
        keep, slots, guarded = [], [], {}
        for (ctype, pname), a in zip(self.signature, args):
            if ctype.endswith("*"):
                element = ctype.replace("const ", "").rstrip("*").strip()
                if not isinstance(a, np.ndarray) or a.dtype.name not in ELEMENTS[element]:
                    raise TypeError(f"{self.name}: {pname} is {ctype}, got {getattr(a, 'dtype', type(a))}")
                owner = owner_of(a)
                if _addr(owner) not in guarded:
                    guarded[_addr(owner)] = _Guarded(owner)
                value = ctypes.c_void_p(guarded[_addr(owner)].address(a))
            else:
                np_type, c_type = SCALARS[ctype.replace("const ", "")]  # a const scalar is passed by value
                if type(a) is not np_type:
                    raise TypeError(f"{self.name}: {pname} is {ctype}, got {type(a).__name__} {a!r}")
                value = c_type(a.item())
            keep.append(value)
            slots.append(ctypes.cast(ctypes.pointer(value), ctypes.c_void_p))
        if self.owner.run and all(grid) and all(block):
            include = precompiled_header("og_raw_headers.h", HEADERS)
            fn = _compile(self.cpu_source, entry="og_launch", include=include)
            status = fn((ctypes.c_void_p * len(slots))(*slots), *grid, *block)
            if status:
                raise AssertionError(f"{self.name}: a thread ended while others waited at __syncthreads")
        for g in guarded.values():
            g.finish(self.name)


class _Guarded:
    """The memory of an array's owner (the root of its ``base`` chain: a view
    runs inside it) copied between two guard bands of 0xFF bytes, 64-byte
    aligned as CuPy's allocations are at least 256-byte aligned."""

    def __init__(self, owner: np.ndarray):
        self.owner = owner
        self.n = owner.nbytes
        self.raw = np.full(self.n + 3 * GUARD, 0xFF, dtype=np.uint8)
        self.start = (-self.raw.ctypes.data) % GUARD + GUARD
        if self.n:
            self.raw[self.start:self.start + self.n] = _flat_bytes(owner)
        self.data = self.raw.ctypes.data + self.start

    def address(self, a: np.ndarray) -> int:
        return self.data + (a.__array_interface__["data"][0] - _addr(self.owner))

    def finish(self, name: str) -> None:
        if (self.raw[:self.start] != 0xFF).any() or (self.raw[self.start + self.n:] != 0xFF).any():
            raise AssertionError(f"{name}: a write outside a buffer of {self.owner.shape} {self.owner.dtype}")
        if self.n and self.owner.flags.writeable:
            _flat_bytes(self.owner)[...] = self.raw[self.start:self.start + self.n]


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def owner_of(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself unless it is a view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    """A uint8 view of the owner ``a``'s whole buffer: its axes in memory order
    (a channels-last owner too) must make it C-contiguous."""
    ordered = a.transpose(np.argsort([-s for s in a.strides], kind="stable"))
    if not ordered.flags.c_contiguous:
        raise TypeError(f"a buffer owner must be dense, got strides {a.strides}")
    return ordered.reshape(-1).view(np.uint8)


def raw_module(owner, code: str):
    """An emulated ``cupy.RawModule(code=code)`` recording into ``owner``
    (``raw_sources``, ``raw_launches``; ``owner.run`` False: record only)."""
    owner.raw_sources.append(code)

    class Module:
        def get_function(self, name):
            return EmulatedRawKernel(owner, code, name)
    return Module()


__all__ = ["HEADERS", "PRELUDE", "EmulatedRawKernel", "raw_module", "parse_signature"]
