"""``compile``: run a pass pipeline on a graph and build an ``Executable``.

This is where the pieces compose: the policy, the pipeline of
``passes/pipelines.py``, the registry's kernels and its device interface
(``registry.device_support``: device resolution, array module and, on cuda,
the version and name queries of the autotune cache keys).
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from opgraph import precision as precisions
from opgraph.errors import ParameterError
from opgraph.executable import Executable
from opgraph.graph import Value, graph_of
from opgraph.op import Lowered
from opgraph.types import FLOAT_DTYPES, TensorType, is_float  # FLOAT_DTYPES: what compile(dtype=...) accepts
from opgraph.backends.registry import KernelContext, device_support, lookup

from .base import PassContext, Pipeline, host_versions
from .pipelines import build
from .policy import DEFAULT_ENGINE_LIMIT, LoweringPolicy
from .policy_names import check_names, idle_include_note, preferences_elsewhere
from .zero_copy import kernel_options


def as_policy(policy) -> LoweringPolicy:
    """A ``LoweringPolicy`` from ``None`` (defaults), a policy, a mapping with
    the TOML schema's keys, or the path of a TOML file.

    Raises:
        PolicyError: bad keys or values; TypeError: another type.
    """
    if policy is None:
        return LoweringPolicy()
    if isinstance(policy, LoweringPolicy):
        return policy
    if isinstance(policy, Mapping):
        return LoweringPolicy.from_mapping(policy)
    if isinstance(policy, (str, os.PathLike)):
        return LoweringPolicy.from_toml(policy)
    raise TypeError(f"policy must be a LoweringPolicy, a dict or a TOML path, not {type(policy).__name__}")


def _float_dtype_name(dtype) -> str:
    """``'float32'`` for ``np.float32``, ``'f4'`` or ``'float32'``; bfloat16 by name.

    Raises:
        ParameterError: not one of :data:`FLOAT_DTYPES`.
    """
    import numpy as np

    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in FLOAT_DTYPES:
        raise ParameterError("dtype", dtype, f"must be one of {', '.join(FLOAT_DTYPES)} or None "
                                             "(it replaces the floating dtype of every feed)")
    return name


#: The device of a compile that names none: the CPU, said as the default in the report.
DEFAULT_DEVICE = "cpu"
#: the end of the note on a ``prefer`` entry naming an algorithm the device has no kernel of
#: (``policy_names.preferences_elsewhere``), which ``opgraph-bench`` repeats in its notes
NEVER_A_CANDIDATE = "so never a candidate here: no effect"


def precision_applied(exe: Executable) -> dict[str, int]:
    """Precision option -> number of steps that took it (the policy's
    precision reaches only rules tagged ``option:precision``)."""
    out: dict[str, int] = {}
    for st in exe.steps:
        p = st.op.option_dict.get("precision")
        if p is not None:
            out[p] = out.get(p, 0) + 1
    return out


def _storage(g, dtype: str | None) -> str:
    """The floating storage a graph runs in: ``compile(dtype=...)``, else its
    first floating source's dtype (float32 without one)."""
    return dtype or next((v.type.dtype for v in g.sources() if is_float(v.type.dtype)), "float32")


def reference_ignores(policy: LoweringPolicy) -> list[str]:
    """The keys of ``policy`` set away from their defaults, which the
    ``reference`` pipeline ignores: it lowers every node to the oracle
    under its own policy (``pipelines.REFERENCE_POLICY``), without the
    layout, fuse and autotune passes."""
    default = LoweringPolicy().to_dict()
    return [k for k, v in policy.to_dict().items() if default.get(k) != v]


def make_context(device: str | None, policy: LoweringPolicy, dtype: str | None, timer=None) -> PassContext:
    """The pass context for ``device`` (array module, and on cuda the device
    backend's ``versions``/``device_name`` for autotune keys); None is
    :data:`DEFAULT_DEVICE`, whose note says it was the default (a device asked
    for by name is never called a default)."""
    devices = device_support()
    name = devices.resolve(DEFAULT_DEVICE if device is None else device)
    # why the device is this one, in the report ('auto' says what it found)
    why = (f"{name}: opgraph.compile's default, no device given" if device is None
           else getattr(name, "reason", None))
    xp = devices.array_module(name)
    extra = {}
    if name == "cuda":
        extra = dict(versions=lambda: {**host_versions(), **devices.versions()},
                     device_name=lambda: devices.device_name("cuda"))
    ctx = PassContext(device=str(name), policy=policy, dtype=dtype, xp=xp, timer=timer, **extra)
    if why:
        ctx.report.note(f"device: {name} ({why})")
    return ctx


def compile(outputs: Value | Sequence[Value], device: str | None = None, policy=None,
            dtype: str | None = None, pipeline: str | Pipeline = "default", *,
            timer=None) -> Executable:
    """Lower the graph of ``outputs`` for ``device`` and return a callable.

    Args:
        outputs: one value or a list of values to compute.
        device: ``'cpu'`` (NumPy), ``'cuda'`` (CuPy) or ``'auto'``; None
            (not given): ``'cpu'``, noted in the report as the default.
        policy: a ``LoweringPolicy``, a dict of its TOML keys, a TOML path,
            or None (default policy).
        dtype: override the floating dtype of every feed (``'float64'`` runs
            the reference oracle in double precision).
        pipeline: ``'default'``, ``'reference'`` (everything to the oracle),
            or a ``Pipeline``.
        timer: autotune timer (tests stub it); default per device.

    Returns:
        An ``Executable``; calling it with feeds returns the output arrays
        (always a list, in the order given). ``exe.report`` is the
        ``LoweringReport`` (per node: chosen implementation, declined
        candidates with reasons, autotune table; planned memory; pass times).

    Raises:
        LoweringError: a node cannot be lowered (reasons listed), a forced
            algorithm declines, or autotune finds no correct candidate.
        PolicyError: a bad policy; DeviceUnavailableError: cuda without GPU.
        ParameterError: ``dtype`` is not a floating dtype.
    """
    if dtype is not None:
        dtype = _float_dtype_name(dtype)
    outs = [outputs] if isinstance(outputs, Value) else list(outputs)
    g = graph_of(*outs)
    pol = as_policy(policy)
    check_names(pol)  # include / exclude name something (passes/policy_names.py)
    ctx = make_context(device, pol, dtype, timer)
    if pipeline == "reference":
        ignored = reference_ignores(pol)
        if ignored:  # every key below would only say the same: the oracle runs, whatever the policy
            ctx.report.note(f"pipeline 'reference': every node runs the oracle kernels, so the policy's "
                            f"{', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no effect "
                            "(pipeline='default' reads them)")
    else:
        _policy_notes(pol, ctx)
    pipe = pipeline if isinstance(pipeline, Pipeline) else build(pipeline, pol)
    lowered, louts = pipe.run(g, outs, ctx)
    xp, dev_name = ctx.xp, ctx.device

    def resolve(op: Lowered, out_type: TensorType):
        rule = lookup(type(op.op), op.algorithm)
        # strided_out is the zero-copy plan's (the step's view copies in), never the kernel's
        options = kernel_options(op.option_dict)
        # a rule (or variant) that declares nothing is left to the replay's trial capture (Rule.capture_blocker)
        blocker = rule.declared_capture_blocker(options) if dev_name == "cuda" else None
        return rule.kernel, KernelContext(xp, dev_name, options, out_type, blocker)  # run type

    # source_graph: the user's values name grad_outputs (the lowered copy lost nodes fusion absorbed)
    exe = Executable(lowered, louts, resolve, xp=xp, device=dev_name, dtype=dtype, source_graph=g)
    for st in exe.steps:  # the zero-copy steps, marked in the report's table
        if st.view is not None and st.name in ctx.report.nodes:
            ctx.report.nodes[st.name].buffer = st.view.describe()
    if pipeline != "reference":  # (its note names the precision among the keys it ignores)
        unused = precisions.unapplied_note(pol.precision, precision_applied(exe), _storage(g, dtype), dev_name)
        if unused:
            ctx.report.note(unused)
    exe.report = ctx.report  # callable: exe.report() still gives the text table
    return exe


#: What the note on engine limits set for a device without cuDNN says (a benchmark record repeats it).
ENGINE_LIMITS_IDLE = "they limit the cuDNN engines autotune times"


def _policy_notes(pol: LoweringPolicy, ctx: PassContext) -> None:
    """The compile's notes on policy keys that can have no effect (autotune's
    keys with autotune off, an include that turns nothing on, a preference
    for an algorithm the device has not)."""
    idle = pol.idle_autotune_keys()
    if idle:
        ctx.report.note(f"policy {', '.join(idle)}: only autotune reads {'it' if len(idle) == 1 else 'them'} "
                        "and the policy's autotune is off (the lowering 'auto' turns it on): no effect unless "
                        "the pipeline has its own autotune pass")
    limits = [f"{k}={v!r}" for k, v in pol.to_dict().items()
              if k == "engine_limits" or (k == "engine_limit" and pol.engine_limit != DEFAULT_ENGINE_LIMIT)]
    if limits and pol.autotune and ctx.device != "cuda":
        ctx.report.note(f"policy {', '.join(limits)}: {ENGINE_LIMITS_IDLE}, and "
                        f"{ctx.device} has none: no effect")
    idle_in = idle_include_note(pol)
    if idle_in:
        ctx.report.note(idle_in)
    elsewhere = preferences_elsewhere(pol, ctx.device)
    if elsewhere:
        ctx.report.note(f"policy prefer {', '.join(elsewhere)}: no implementation on {ctx.device}, "
                        f"{NEVER_A_CANDIDATE}")


__all__ = ["NEVER_A_CANDIDATE", "compile", "as_policy", "make_context", "precision_applied", "reference_ignores", "DEFAULT_DEVICE"]
