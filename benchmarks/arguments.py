"""``opgraph-bench``'s command line: the argument parser and the parsing of
its values (model names and groups, lowerings, precisions, counts, seconds).
A bad value is an ``argparse`` usage error of one line naming the flag, the
value, the allowed names and a close one (:mod:`.flag_values`; exit status 2)."""

from __future__ import annotations

import argparse
import math

import attrs

import opgraph
from opgraph.errors import ParameterError, did_you_mean
from opgraph.passes.policy import PRECISIONS, LoweringPolicy
from opgraph.passes.policy_names import check_names

from . import compare, driver, lowerings as lw, report
from .flag_values import BriefUsageParser, ParagraphFormatter, one_of, unknown_value
from .models import ALIASES, LAYERS, MODELS, MODERN, WINNERS, resolve
from .peer_run import PEERS
from .timer import AUTO_MAX_SECONDS, AUTO_ROUND, AUTO_THRESHOLD

#: Names of model groups accepted by --model and --suite.
GROUPS = {"all": WINNERS + LAYERS + MODERN, "winners": WINNERS, "layers": LAYERS, "modern": MODERN}
#: The values of --device, --dtype and --layout.
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64", "float16", "bfloat16")
LAYOUTS = ("nchw", "nhwc")


def entries(text: str) -> list[str]:
    """The stripped, comma-separated entries of a list flag's value.

    Raises:
        argparse.ArgumentTypeError: an empty entry (``L1,,L2``, a comma at
            an end): a typo, which used to be dropped without a word.
    """
    items = [p.strip() for p in text.split(",")]
    if text.strip() and not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty entry (two commas in a row, or one at an end)")
    return [p for p in items if p]


def parse_models(text: str) -> list[str]:
    """``--model`` value -> registry names: comma-separated names, aliases
    (``overfeat_fast``, ``googlenet_v1``, ``resnet-50``, ...) or groups
    (``all``, ``winners``, ``layers``, ``modern``), case-insensitive,
    duplicates dropped.

    Raises:
        argparse.ArgumentTypeError: an unknown name or an empty entry
            (argparse exits with 2).
    """
    names: list[str] = []
    for part in entries(text):
        if part.lower() in GROUPS:
            found = list(GROUPS[part.lower()])
        else:
            try:
                found = [resolve(part)]
            except KeyError:
                # the close names offered are models and groups: three spellings of one model say less
                raise unknown_value("model", part, [*MODELS, *GROUPS],
                                    f"{', '.join(MODELS)}, the aliases {', '.join(ALIASES)}, "
                                    f"or the groups {', '.join(GROUPS)}") from None
        names += [n for n in found if n not in names]
    if not names:
        raise argparse.ArgumentTypeError("no model given")
    return names


def _list_of(allowed, what: str):
    def parse(text: str) -> list[str]:
        given = [p.lower() for p in entries(text)]
        items = list(dict.fromkeys(given))
        bad = [i for i in items if i not in allowed]
        if bad:
            raise unknown_value(what, bad, allowed)
        if not items:
            raise argparse.ArgumentTypeError(f"no {what} given; choose from {', '.join(allowed)}")
        twice = [i for i in items if given.count(i) > 1]
        if twice:  # one column each: a second would be silently merged away
            raise argparse.ArgumentTypeError(f"{what} {', '.join(map(repr, twice))} given more than once")
        return items
    return parse


def is_policy_item(item: str) -> bool:
    """Whether a ``--lowering`` item changes the policy (``LoweringPolicy.from_cli``:
    ``conv=fft+gemm``, ``@conv2=fft``, ``exclude=winograd``) rather than name a
    column: it forces a node (``@...``) or has a ``KEY=`` whose key holds no
    ``@`` (a column spec such as ``cudnn@ws=0`` is a column)."""
    key, sep, _ = item.partition("=")
    return item.startswith("@") or (bool(sep) and "@" not in key)


@attrs.frozen
class PolicyColumn:
    """The one column of a ``--lowering`` made of policy items only
    (``conv=fft+gemm,@conv2=fft``): the base policy, which those items changed
    (``LoweringPolicy.from_cli``), as it is. Named by the items; it prefers no
    algorithm of its own, so it applies to every model."""

    name: str
    algorithm = None
    autotune = False

    def describe(self) -> str:
        return f"the policy of --lowering {self.name} (docs/policy.md, Command line)"

    def policy(self, base: LoweringPolicy, device: str) -> LoweringPolicy:
        return base

    def policy_note(self, policy: LoweringPolicy) -> None:
        """Nothing to say: the column is its policy, autotuned or not (``Lowering.policy_note``)."""
        return None


class LoweringAction(argparse.Action):
    """``--lowering LIST``: the column names go to ``args.lowering`` (a list of
    lowerings, :func:`lowerings.parse_lowerings`), the policy items
    (:func:`is_policy_item`) to ``args.lowering_policy`` (a string for
    ``LoweringPolicy.from_cli``; they apply to every column). Items alone make
    one :class:`PolicyColumn`.

    Raises:
        argparse.ArgumentError: an unknown column name, a bad policy item or
            an include / exclude name that names nothing or that the other
            covers (``passes/policy_names.py``), said once
            (:func:`policy_item_error`; argparse exits with 2, naming the flag).
    """

    def __call__(self, parser, namespace, text, option_string=None):
        try:
            items = entries(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        policy = ",".join(i for i in items if is_policy_item(i))
        columns = ",".join(i for i in items if not is_policy_item(i))
        try:
            if policy:  # a bad item or include / exclude name fails here, before any work
                check_names(LoweringPolicy.from_cli(lowering=policy))
            lowerings = lw.parse_lowerings(columns) if columns or not policy else [PolicyColumn(policy)]
        except ParameterError as e:
            raise argparse.ArgumentError(self, policy_item_error(e)) from None
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        namespace.lowering, namespace.lowering_policy = lowerings, policy or None


def policy_item_error(e: ParameterError) -> str:
    """The error of a ``--lowering`` policy item as argparse's ``argument
    --lowering:`` ends: the key and the value once, ``include='pool-scann':
    names no ...`` (``LoweringPolicy.from_cli`` names its errors' parameter
    ``--lowering KEY``, which argparse's prefix would repeat)."""
    key = e.param.removeprefix("--lowering").lstrip(": ")
    return f"{key}={e.value!r}: {e.why}" if key else f"{e.value!r}: {e.why}"


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value
    return parse


def _repeat(text: str) -> int | str:
    """``--repeat`` value: a count of 1 or more, or ``auto`` (:class:`timer.AdaptiveTimer`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return _count(1)(text)
    except argparse.ArgumentTypeError as e:
        hint = did_you_mean(text.strip().lower(), ["auto"])
        raise argparse.ArgumentTypeError(f"{e}{hint}; give a count >= 1 or auto") from None


def _seconds(text: str) -> float:
    """``--time-limit`` value -> seconds, zero or more (``inf``: no limit).

    Raises:
        argparse.ArgumentTypeError: not a number, negative or NaN (argparse
            exits with 2 naming the flag): such a limit would skip every column.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a time of zero or more seconds")
    return value


#: --output suffix -> the format written when --format is not given.
SUFFIX_FORMATS = {".json": "json", ".csv": "csv", ".md": "markdown"}


def output_format(args) -> str:
    """``--format``, else the one ``--output``'s suffix names (``run.json`` is JSON,
    as a user who names the file expects), else ``table``."""
    if args.format is not None:
        return args.format
    import os
    suffix = os.path.splitext(args.output or "")[1].lower()
    return SUFFIX_FORMATS.get(suffix, "table")


#: The ``compare`` subcommand's usage, as ``opgraph-bench --help`` gives it (``benchmarks/compare.py``'s).
COMPARE_USAGE = compare.USAGE


def build_parser(prog: str = compare.COMMAND) -> argparse.ArgumentParser:
    """The command's parser; ``prog`` is how it was invoked (the console
    script ``opgraph-bench``, or ``python -m opgraph.benchmarks``): its usage,
    its usage errors and the commands its epilog gives name it."""
    p = BriefUsageParser(
        prog=prog,
        description="Time the ImageNet winners of convnet-benchmarks (AlexNet, OverFeat-fast, VGG-A, "
                    "GoogLeNet v1), its layers L1-L5 and the modern convnets (ResNet-50, DenseNet-121, "
                    "MobileNet-v2, EfficientNet-B0; --suite modern) built as opgraph graphs, or ONNX "
                    "files (--onnx): forward, backward-data and backward-filter per lowering, per layer "
                    "and end to end, each lowering checked against a float64 reference first; with "
                    "--compare, the PyTorch peers on the same model in the same run. --profile: where "
                    "one training step's time goes, per op type and direction against the measured "
                    "limits; --summary: shapes, parameters and FLOPs, nothing run.",
        formatter_class=ParagraphFormatter,
        epilog=f"Two runs compared: {compare.usage(prog)} (speedups and regressions between two runs written "
               "with --format json, per column and phase, marked where beyond both runs' interquartile "
               f"range; {prog} compare --help says more).\n\n"
               "Exit status: 0 ok; 2 usage error; 1 device or model failure; 3 some column is a "
               "mismatch or an error (outputs written first); 4 --time-limit left nothing timed; "
               "130 Ctrl-C (the finished columns are written first).")
    p.add_argument("--version", action="version", version=f"%(prog)s {opgraph.__version__}",
                   help="print the installed opgraph's version and exit")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--model", type=parse_models, default=None, metavar="NAME[,NAME]",
                      help="alexnet, overfeat, vgg_a, googlenet, L1..L5, resnet50, densenet121, "
                           "mobilenet_v2, efficientnet_b0, or a group: winners (default), layers, "
                           "modern, all")
    what.add_argument("--suite", choices=tuple(GROUPS), type=one_of(tuple(GROUPS), "group"), default=None,
                      help="a group of models: winners (the four ImageNet models), layers (L1-L5), "
                           "modern (ResNet-50, DenseNet-121, MobileNet-v2, EfficientNet-B0, "
                           "training-form batch norm), all")
    p.add_argument("--onnx", action="append", default=[], metavar="PATH",
                   help="benchmark an ONNX network (one image input, one output; every other graph "
                        "input is a parameter, as in a weightless export), after the --model/--suite "
                        "models when one is given, alone otherwise; repeatable")
    p.add_argument("--onnx-input", default=None, metavar="NAME",
                   help="the image input of the --onnx files (default: each file's first graph input)")
    p.add_argument("--batch", type=_count(1), default=None,
                   help="mini-batch (default: convnet-benchmarks' 128 / VGG-A 64, the modern suite's 128 / "
                        "DenseNet-121 64, on a GPU and for --summary; "
                        f"{driver.CPU_DEFAULT_BATCH} on the CPU, where the default run of the four "
                        f"winners takes {driver.CPU_RUN_TIME})")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   type=one_of(DEVICES, "device", meant={"gpu": "cuda", "nvidia": "cuda"}),
                   help="auto: the GPU if CuPy sees one, else the CPU (default)")
    p.add_argument("--dtype", choices=DTYPES, type=one_of(DTYPES, "dtype"), default="float32",
                   help="storage dtype of inputs, parameters, activations and gradients, --onnx "
                        "networks included (default float32; bfloat16 with --precision bf16 keeps the "
                        "whole step in bf16, computing in fp32)")
    p.add_argument("--lowering", action=LoweringAction, default=None, metavar="LIST",
                   help="columns: convolution algorithms (gemm, fft, winograd, direct, cudnn, ...), "
                        "auto (autotune) or default, each optionally with a workspace limit as its "
                        "own column (cudnn@ws=0, auto@ws=64MiB); default: every algorithm the GPU "
                        f"runs plus auto, or {','.join(lw.CPU_DEFAULT)} on the CPU. Policy items apply "
                        "to every column (alone they make one column): conv=fft+gemm (prefer), "
                        "@conv2=fft (force a layer; @conv2:forward=fft one direction), "
                        "exclude=winograd, include=NAME (docs/policy.md)")
    p.set_defaults(lowering_policy=None)
    # None when not given, so that a --policy file's precision and layout are not overridden
    p.add_argument("--precision", type=_list_of(PRECISIONS, "precision"), default=None,
                   metavar="LIST", help=f"comma-separated, from {', '.join(PRECISIONS)} (default: "
                                        "the --policy file's, else fp32)")
    p.add_argument("--layout", choices=LAYOUTS, type=one_of(LAYOUTS, "layout", fold_case=True), default=None,
                   help="layout the policy asks for (default: the --policy file's, else nchw); "
                        "NHWC applies on cuda only, to opgraph and the peer (channels_last) alike, "
                        "and results record the layout applied")
    p.add_argument("--policy", metavar="TOML", help="a base LoweringPolicy file (passes/policy.py); without "
                   "--lowering, one whose prefer covers the convolutions makes the one column default")
    p.add_argument("--workspace-limit", default=None, metavar="BYTES",
                   help="scratch budget per node, e.g. 512MiB (policy workspace_limit)")
    p.add_argument("--workspace-tolerance", default=None, metavar="FRACTION",
                   help="autotune keeps the smallest workspace among candidates within this "
                        "fraction of the fastest, e.g. 0.03 or 3%% (policy workspace_tolerance; "
                        "default 0.03, 0 keeps the fastest)")
    p.add_argument("--peak-tolerance", default=None, metavar="FRACTION",
                   help="a node whose workspace raises the planned memory peak above the lowest "
                        "reachable one gets the fastest candidate within this fraction of its fastest that "
                        "keeps its step under that peak, e.g. 0.2 or 20%% (policy peak_tolerance; default "
                        "0.20, 0 keeps the time-based choice)")
    p.add_argument("--engine-limit", default=None, metavar="N|all",
                   help="autotune times at most N cuDNN engines per node, the first that build in "
                        "cuDNN's heuristic order (policy engine_limit; default 10, as PyTorch's "
                        "cudnn.benchmark_limit; all: every engine)")
    p.add_argument("--compare", type=_list_of(PEERS, "peer"), default=[], metavar="PEERS",
                   help="PyTorch peers on the same model, same run: torch (eager, cudnn.benchmark), "
                        "torch+graph (the whole step captured in a CUDA graph), torch-compile "
                        "(torch.compile(dynamic=False)), torch-compile+graph; the +graph ones need "
                        "a GPU")
    p.add_argument("--warmup", type=_count(0), default=None,
                   help=f"untimed iterations (default {driver.GPU_WARMUP} on a GPU as convnet-benchmarks, "
                        f"{driver.CPU_WARMUP} on the CPU)")
    p.add_argument("--repeat", type=_repeat, default=None, metavar="N|auto",
                   help=f"timed calls per loop (default {driver.GPU_REPEAT} on a GPU, "
                        f"{driver.CPU_REPEAT} on the CPU); auto: rounds of {AUTO_ROUND} calls until the "
                        f"interquartile range is within {AUTO_THRESHOLD * 100:.0f}%% of the median, at most "
                        f"{AUTO_MAX_SECONDS:g} s per loop (benchmarks/timer.py, AdaptiveTimer)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also replay each phase as CUDA graphs: a column <lowering>+graph per lowering, "
                        "from the same compiled graph (cuda only; steps that cannot be captured, "
                        "e.g. cuBLAS calls, run eagerly between the graphs)")
    p.add_argument("--no-per-layer", dest="per_layer", action="store_false",
                   help="skip timing each layer alone")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the float64 reference check (columns are then unchecked)")
    p.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="start no new column after this many seconds, counted from the start of the run "
                        "(the peak measurement included; the rest: 'skipped')")
    p.add_argument("--summary", action="store_true",
                   help="print per-layer output shape, parameters and forward GFLOP; run nothing")
    p.add_argument("--profile", action="store_true",
                   help="profile instead of benchmarking: every step of the training step timed alone, "
                        "grouped per op type and direction with bytes moved, FLOPs, GB/s, TFLOP/s and the "
                        "fraction of the copy bandwidth or matmul peak measured in the same run (one "
                        "lowering per column: default auto on a GPU, gemm on the CPU)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write the result document as JSON to PATH (atomically), whatever --format")
    p.add_argument("--format", choices=report.FORMATS, type=one_of(report.FORMATS, "format"), default=None,
                   help="default: from --output's suffix (.json, .csv, .md), else table")
    p.add_argument("--output", metavar="PATH", help="write the result there instead of stdout "
                   "(JSON is rewritten after every column, so a killed run keeps what it finished)")
    p.add_argument("--plot", metavar="PATH.png", help="bar chart of forward + backward per model")
    p.add_argument("--trace", metavar="PATH.json",
                   help="one training step of every timed column as a Chrome trace (JSON trace events; "
                        "Perfetto opens it): an event per node, named by node, op, algorithm and "
                        "direction; perf_counter on the CPU, CUDA events on a GPU")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.add_argument("--seed", type=_count(0), default=0,
                   help="seed of the random input and weights (0 or more; default 0)")
    return p


def model_names(args) -> list[str]:
    """Built-in models to run: ``--model``, else ``--suite``, else the four
    winners -- unless only ``--onnx`` files were asked for."""
    if args.model is not None:
        return args.model
    if args.suite is None and getattr(args, "onnx", None):
        return []
    return list(GROUPS[args.suite or "winners"])


__all__ = ["GROUPS", "DEVICES", "DTYPES", "LAYOUTS", "BriefUsageParser", "COMPARE_USAGE", "entries", "parse_models", "build_parser",
           "model_names", "is_policy_item",
           "PolicyColumn", "LoweringAction", "policy_item_error"]
