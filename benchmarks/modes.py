"""The modes of ``opgraph-bench`` besides the benchmark, ``--summary`` and
``--profile``, and what every mode reads off the command line: the models
(built-in and ``--onnx``), the base lowering policy of the columns and the
checks of the policy flags, whether a lowering applies at all, and the
warnings about missing GPU libraries.

A ``--profile`` column and a benchmark column of the same ``--lowering`` spec
compile with one policy: both take the base from :func:`base_policy`, the
precisions and layout from :func:`precisions_and_layout`, and put the
lowering's choice on top (:meth:`.lowerings.Lowering.policy`). The benchmark
mode itself is :func:`.cli.run_timing`.
"""

from __future__ import annotations

import difflib
import os
import sys

import attrs

from opgraph.analysis import summarize, totals
from opgraph.backends.registry import algorithm_devices
from opgraph.errors import ParameterError
from opgraph.passes.force import DIRECTIONS, matches_a_node
from opgraph.passes.policy import DEFAULT_ENGINE_LIMIT, LoweringPolicy, PolicyError, parse_engine_limit
from opgraph.passes.policy_names import check_names, idle_include_note

from . import driver, lowerings as lw, report
from .environment import environment
from .models import LAYERS, SEED_BATCHES, build
from .usage import UsageError


def log(msg: str) -> None:
    """One line to standard error, at once (progress and warnings of the command)."""
    print(msg, file=sys.stderr, flush=True)


def build_models(names, args, device: str, notes: list[str]) -> list:
    """The built-in models ``names`` at ``--batch``, else the device's default
    batch (``driver.default_batch``; why, added to ``notes`` once), in
    ``--dtype``, then the ``--onnx`` files (:func:`onnx_models`).

    Raises:
        UsageError: a bad ``--onnx-input`` or an ``--onnx`` file named as
            another model (:func:`onnx_models`).
    """
    models = []
    run_seeds = {name: SEED_BATCHES[name] for name in names}  # the note quotes these models only
    for name in names:
        batch, reason = driver.default_batch(SEED_BATCHES[name], device, args.batch, run_seeds)
        note = f"batch {batch}: {reason}"
        if note not in notes:
            notes.append(note)
        models.append(build(name, batch=batch, dtype=args.dtype))
    onnx = onnx_models(args, taken=[m.key for m in models])
    if args.batch is None:
        notes += [file_batch_note(m) for m in onnx]
    return models + onnx


def file_batch_note(model) -> str:
    """Where an ``--onnx`` model's batch came from, when ``--batch`` was not given."""
    return f"{model.key}: batch {model.batch}, the file's (a symbolic batch builds 1; set with --batch)"


def onnx_models(args, taken=()) -> list:
    """The ``--onnx`` files as models, built at ``--batch`` (else the file's) in
    ``--dtype``, each with the ``--onnx-input`` image (else its first graph input).

    Raises:
        UsageError: an ``--onnx`` path that is no file (``--onnx: no such
            file: PATH``), checked for every file before any is read, and
            before the ``onnx`` package is asked for; ``--onnx-input`` without
            ``--onnx``, or naming no graph input of a file (the message lists
            them); a file whose model name (its file name) is one of ``taken``
            (the run's other models) or another file's: results, tables and
            ``compare`` tell models apart by name.
    """
    from .onnx_model import load_model

    for path in args.onnx:  # a typo in a path is the first thing to fix, the onnx package or not
        if os.path.isdir(path):
            raise UsageError(f"--onnx: not a file but a folder: {path}")
        if not os.path.exists(path):
            raise UsageError(f"--onnx: no such file: {path}")
    if args.onnx_input is not None and not args.onnx:
        raise UsageError(f"--onnx-input {args.onnx_input}: names the image input of --onnx files, "
                         "and no --onnx file is given")
    models, seen = [], set(taken)
    for path in args.onnx:
        try:
            model = load_model(path, batch=args.batch, dtype=args.dtype, input_name=args.onnx_input)
        except ParameterError as e:
            if e.param != "input_name":
                raise
            raise UsageError(f"--onnx-input {args.onnx_input}: {e.why}") from None
        if model.key in seen:
            raise UsageError(f"--onnx {path}: its model name {model.key!r} (the file's name) is already the name "
                             "of another model of this run, and results are told apart by name: copy the file "
                             "under another name")
        seen.add(model.key)
        models.append(model)
    return models


def gpu_library_notes(device: str) -> list[str]:
    """:func:`.environment.missing_gpu_libraries`, each also printed as a
    warning (a profile taken without the cuDNN frontend looked like a cuDNN
    one until its convolutions were read)."""
    from .environment import missing_gpu_libraries

    lines = missing_gpu_libraries(device)
    for line in lines:
        log(f"opgraph-bench: warning: {line}")
    return lines


def device_flag_notes(args, device: str) -> list[str]:
    """Notes for flags given that ``device`` has nothing to apply to (a flag is
    never silently ignored): ``--layout nhwc`` is acted on for cuda only (the
    layout pass keeps NCHW elsewhere). ``--engine-limit`` (cuDNN engines, on cuda
    only) is noted by the compile of each autotuned column, as a policy file's
    ``engine_limit`` and ``engine_limits`` are (``passes/compiler.py``), unless it
    gives the default, which a policy cannot tell from no flag: noted here then."""
    notes = []
    if args.layout == "nhwc" and device != "cuda":
        notes.append(f"--layout nhwc: the layout pass stores NHWC on cuda only; {device} runs NCHW")
    given = args.engine_limit
    if given is not None and device != "cuda" and parse_engine_limit(given, "--engine-limit") == DEFAULT_ENGINE_LIMIT:
        notes.append(f"--engine-limit {given}: it limits the cuDNN engines autotune times, and {device} "
                     "has none: no effect")
    return notes


def check_policy_flags(args) -> None:
    """Refuse a bad value of a policy flag (``--workspace-limit``,
    ``--workspace-tolerance``, ``--peak-tolerance``, ``--engine-limit``) in
    every mode, before any work: :func:`base_policy` reads them for a
    benchmark or a profile, and ``--summary`` must not take ``--engine-limit
    0`` silently either.

    Raises:
        PolicyError: naming the flag and the value (exit 2).
    """
    LoweringPolicy.from_cli(workspace_limit=args.workspace_limit, workspace_tolerance=args.workspace_tolerance,
                            peak_tolerance=args.peak_tolerance, engine_limit=args.engine_limit)


def _source_of(args, key: str, value) -> str:
    """Which of the flags gave ``value`` (a name, or a list of names: the
    exclude names covering an include) under ``key`` (``include``/``exclude``):
    the ``--lowering`` policy items or the ``--policy`` file."""
    if args.lowering_policy:
        items = LoweringPolicy.from_cli(lowering=args.lowering_policy)
        if set([value] if isinstance(value, str) else value) <= set(getattr(items, key)):
            return f"--lowering {args.lowering_policy}"
    return f"--policy {args.policy}" if args.policy else "the policy"


def base_policy(args, lowerings, device: str, notes: list[str] | None = None) -> LoweringPolicy:
    """The base policy of every column, a benchmark's or ``--profile``'s alike
    (each column puts its lowering's choice on top, :meth:`.lowerings.Lowering.policy`):
    the ``--policy`` file, then the policy items of ``--lowering``
    (``conv=fft+gemm``, ``@conv2=fft``, ``exclude=winograd``) and the policy
    flags (``LoweringPolicy.from_cli``). An ``include`` entry that turns
    nothing on (``include=pool-scan``: every fusion rule runs unless excluded)
    is said in ``notes``, the run's (``policy_names.idle_include_note``; each
    compile's report says it too, which no record repeated).

    Raises:
        PolicyError: a bad file, policy item, value or include / exclude name
            (exit 2, not a silent no-op).
        UsageError: a flag that only steers autotune while no column of
            ``lowerings`` autotunes on ``device``.
    """
    base = LoweringPolicy.from_cli(lowering=args.lowering_policy, policy_file=args.policy,
                                   workspace_limit=args.workspace_limit,
                                   workspace_tolerance=args.workspace_tolerance,
                                   peak_tolerance=args.peak_tolerance, engine_limit=args.engine_limit)
    try:
        check_names(base)
    except PolicyError as e:  # name where the unknown entry came from, as a bad value is named
        raise PolicyError(f"{_source_of(args, e.param, e.value)}: {e.param}", e.value, e.why) from None
    unused = lw.unused_autotune_flags(autotune_flags(args), lowerings, base, device)
    if unused:
        raise UsageError(unused)
    if notes is not None:
        notes += filter(None, [idle_include_note(base)])
    return base


def precisions_and_layout(args, base: LoweringPolicy) -> tuple[list[str], str]:
    """The precisions and the layout (``'NCHW'`` / ``'NHWC'``) the columns ask
    for: the flags win over the ``--policy`` file, which wins over the
    defaults (fp32, NCHW)."""
    return args.precision or [base.precision], (args.layout.upper() if args.layout else base.layout)


def autotune_flags(args) -> dict:
    """The flags that only steer autotune, by name: their values, None when not given."""
    return {"--engine-limit": args.engine_limit, "--workspace-tolerance": args.workspace_tolerance,
            "--peak-tolerance": args.peak_tolerance}


def check_applicable(tgs, lowerings, device: str, base: LoweringPolicy) -> str | None:
    """A message when some explicit lowering applies to no convolution of any
    of the models (a usage error: its column would only repeat the fallback),
    else None."""
    for lo in lowerings:
        if lo.algorithm is None:
            continue
        policy = lo.policy(base, device)
        reasons: dict[str, list[str]] = {}
        usable = False
        for tg in tgs:
            app = lw.applicability(tg, lo, device, policy)
            if any(why is None for why in app.values()):
                usable = True
                break
            for why in app.values():
                reasons.setdefault(why, [])
                if tg.model.key not in reasons[why]:
                    reasons[why].append(tg.model.key)
        if not usable and reasons:
            detail = "; ".join(f"{', '.join(ms)}: {why}" for why, ms in list(reasons.items())[:4])
            return (f"lowering {lo.name!r} cannot run any convolution of the selected models on "
                    f"{device} ({detail}); choose other lowerings or models")
    return None


def check_forces(tgs, args, device: str) -> None:
    """Refuse force keys that name no node of any model of the run (a typo):
    every column would only be the fallback's, marked n/a, and the run exit 0.

    * a ``--lowering`` force item (``@conv99=fft``, ``@conv99:forward=fft``)
      whose key names no node of any model;
    * a ``--lowering`` force item whose algorithm has no implementation on
      ``device`` (``@conv1=unfold`` on the CPU: every column would fail to
      compile, after the others had been timed);
    * a ``--policy`` file none of whose ``force`` keys names a node of any
      model (the file would be ignored). A file may serve several models, so
      a key naming a node of some model only, or a file of which some keys
      match and others not, stays allowed: ``og.compile`` warns about each
      key that matches no node of a graph, and a model none of whose nodes
      is forced gets n/a columns that say why.

    Matched as the compiler matches (:func:`opgraph.passes.force.matches_a_node`),
    against the training graphs before any work.

    Raises:
        UsageError: naming the item (or the file and its keys), the models
            and some layers they have.
    """
    if not tgs:
        return
    names = {tg.model.key: [(v.name, getattr(v.op, "direction", None))
                            for v in tg.model.graph.nodes_in_order(tg.outputs)] for tg in tgs}
    for item in (i for i in (args.lowering_policy or "").split(",") if i.strip().startswith("@")):
        key, _, algorithm = (part.strip() for part in item.partition("="))
        key = key[1:].strip()
        if _unmatched([key], names):
            wrong_phase = _phase_hint(key, names)
            if wrong_phase:
                raise UsageError(f"--lowering {item.strip()}: {wrong_phase}")
            raise UsageError(f"--lowering {item.strip()}: {key!r} names no node of {_forces_hint(tgs)}")
        devices = algorithm_devices(algorithm)
        if devices and device not in devices:
            raise UsageError(f"--lowering {item.strip()}: {algorithm!r} has no implementation on {device} "
                             f"(it runs on {', '.join(sorted(devices))})")
    if args.policy:
        keys = list(LoweringPolicy.from_toml(args.policy).force)  # base_policy read it without error
        missing = _unmatched(keys, names)
        if keys and len(missing) == len(keys):
            listed = ", ".join(repr(k) for k in missing)
            raise UsageError(f"--policy {args.policy}: its force key(s) {listed} name no node of "
                             f"{_forces_hint(tgs)}")


def _unmatched(keys, names: dict[str, list[tuple]]) -> list[str]:
    """The force keys of ``keys`` that name no node of any model (model -> its
    nodes' ``(name, direction)``)."""
    return [k for k in keys if not any(matches_a_node(k, ns) for ns in names.values())]


def _phase_hint(key: str, names: dict[str, list[tuple]]) -> str | None:
    """For a key ``LAYER:WORD`` whose layer names a node but whose WORD is no phase (``conv1:fwd``):
    what is wrong and the phase meant (the op's direction codes fwd/dgrad/wgrad map to their phase
    names, else the closest phase name); None for any other key."""
    layer, sep, word = key.rpartition(":")
    if not sep or not layer or word in DIRECTIONS.values() or _unmatched([layer], names):
        return None
    meant = DIRECTIONS.get(word) or next(iter(difflib.get_close_matches(word, DIRECTIONS.values(), n=1)), None)
    phases = ", ".join(f":{w}" for w in DIRECTIONS.values())
    return (f"{layer!r} is a layer, but {':' + word!r} is not one of its phases ({phases})"
            + (f": did you mean {layer}:{meant}?" if meant else ""))


def _forces_hint(tgs) -> str:
    """The rest of a message about force keys that name no node: the models of
    the run, some layers of (the first three of) them, what a key may be."""
    layers = "; ".join(f"{tg.model.key}: {_few(list(tg.layers))}" for tg in tgs[:3])
    return (f"the model(s) of this run ({', '.join(tg.model.key for tg in tgs)}); convolution and linear "
            f"layers: {layers}{'; ...' if len(tgs) > 3 else ''} (a force key is a node name or pattern, "
            "a layer optionally with :forward, :backward_data or :backward_filter; --summary lists each "
            "model's layers)")


def _few(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "") if names else "(none)"


def run_summary(names: list[str], args) -> dict:
    """The summary document of ``names`` (no kernel runs)."""
    models = []
    built = [build(name, batch=args.batch, dtype=args.dtype) for name in names]
    built += onnx_models(args, taken=[m.key for m in built])
    for m in built:
        rows = summarize(m.graph, [m.output])
        models.append(report.model_record(m.key, m.spec_key, m.title, m.batch, m.dtype, rows,
                                          totals(rows, m.graph, [m.output])))
    batch = (f"batch {args.batch} (set with --batch)" if args.batch is not None
             else "the seed benchmark's (or the modern suite's) batch of each model")
    onnx_notes = [] if args.batch is not None else [file_batch_note(m) for m in built if m.spec_key == "onnx"]
    return {"tool": "opgraph-bench", "mode": "summary", "schema_version": report.SUMMARY_SCHEMA_VERSION,
            "environment": environment("none", batch=args.batch, dtype=args.dtype),
            "notes": [f"static summary at {batch}; forward FLOPs from each op's rule, a "
                      "multiply-add counted as 2 (convolution and linear exclude the bias add)", *onnx_notes],
            "models": models}


def run_profile(names: list[str], args) -> dict:
    """``--profile``: every model x precision x lowering profiled step by step
    (:mod:`.profile`), against the limits measured once at the start."""
    from . import profile as pf
    from .protocol import training_graph
    from .records import release_device
    from .timer import make_timer

    device, why = driver.resolve_device(args.device)
    warmup, repeat = driver.protocol_defaults(device, args.warmup, args.repeat)
    notes = [f"device: {device} ({why})", *gpu_library_notes(device), *device_flag_notes(args, device),
             f"profile: each step {warmup} warm-up + {repeat} timed calls, median"]
    models = build_models(names, args, device, notes)
    lowerings = args.lowering or [lw.Lowering("auto" if device == "cuda" else lw.CPU_DEFAULT[0])]
    # as a benchmark's columns on the CPU; on a GPU the profile's auto already times every candidate
    from_file = None if args.lowering or device == "cuda" else lw.policy_file_default(args.policy)
    if from_file is not None:
        lowerings, note = from_file
        notes.append(note)
    base = base_policy(args, lowerings, device, notes)  # the benchmark's: a column of either compiles alike
    tgs = [training_graph(m, input_grad=m.spec_key in LAYERS) for m in models]
    check_forces(tgs, args, device)
    problem = check_applicable(tgs, lowerings, device, base)
    if problem:
        raise UsageError(problem)
    precisions, layout = precisions_and_layout(args, base)
    limits = pf.measure_limits(device, precisions)
    timer = make_timer(device)
    records = []
    for tg in tgs:
        m = tg.model
        for precision in precisions:
            policy = attrs.evolve(base, precision=precision, layout=layout)
            for lowering in lowerings:
                why = lw.inapplicable(tg, lowering, device, lowering.policy(policy, device))
                if why:  # as the benchmark's n/a column: a profile of the fallback under this name misleads
                    notes.append(f"{m.key} {precision} {lowering.name}: not profiled: {why}")
                    log(f"opgraph-bench: {notes[-1]}")
                    continue
                if not args.quiet:
                    log(f"opgraph-bench: profiling {m.key} {precision} {lowering.name}")
                records.append(pf.profile_model(tg, lowering, policy, device, timer, limits, warmup=warmup,
                                                repeat=repeat, seed=args.seed))
                cached = pf.profile_cache_note(records[-1]["autotune"])  # in the record's notes; said now too
                if cached:
                    log(f"opgraph-bench: {m.key} {precision} {lowering.name}: {cached}")
                release_device(device)
    env = environment(device, precision=list(precisions), layout=driver.applied_layout(layout, device),
                      layout_requested=layout, warmup=warmup, repeat=repeat,
                      lowerings=[lo.name for lo in lowerings], seed=args.seed)
    return pf.profile_document(env, limits, records, notes)


__all__ = ["log", "build_models", "onnx_models", "gpu_library_notes", "device_flag_notes", "check_policy_flags", "base_policy",
           "precisions_and_layout", "autotune_flags", "check_applicable", "run_summary", "run_profile"]
