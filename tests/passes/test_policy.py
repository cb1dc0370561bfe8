"""LoweringPolicy: construction, TOML loading, CLI strings, queries."""


import numpy as np
import pytest

from opgraph.passes.policy import DEFAULT_ORDER, LoweringPolicy, PolicyError, parse_bytes

GOOD_TOML = """
autotune = true
workspace_limit = "512MiB"
precision = "tf32"
layout = "NHWC"
include = ["extra"]
exclude = ["winograd"]
explicit_padding = ["fft"]
cache = "/tmp/somewhere.json"

[prefer]
conv = ["fft", "gemm"]
conv_wgrad = "direct"
MaxPool2d = ["reference"]

[force]
"conv2" = "fft"
"block*/conv" = "gemm"
"""


def write(tmp_path, text, name="policy.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_toml_loads_every_key(tmp_path):
    p = LoweringPolicy.from_toml(write(tmp_path, GOOD_TOML))
    assert p.autotune is True
    assert p.workspace_limit == 512 * 2**20
    assert (p.precision, p.layout) == ("tf32", "NHWC")
    assert p.include == {"extra"} and p.exclude == {"winograd"}
    assert p.explicit_padding == {"fft"}
    assert p.cache == "/tmp/somewhere.json"
    assert p.prefer["conv"] == ("fft", "gemm") and p.prefer["conv_wgrad"] == ("direct",)
    assert p.forced("conv2") == "fft"
    assert p.forced("block3/conv") == "gemm"  # fnmatch pattern
    assert p.forced("conv1") is None


def test_toml_roundtrip_through_to_dict(tmp_path):
    p = LoweringPolicy.from_toml(write(tmp_path, GOOD_TOML))
    assert LoweringPolicy.from_mapping(p.to_dict()) == p


@pytest.mark.parametrize("text, key, value", [
    ("autotun = true", "autotun", "True"),                       # unknown key
    ('precision = "fp8"', "precision", "fp8"),                   # bad choice
    ('layout = "CHWN"', "layout", "CHWN"),
    ('workspace_limit = "lots"', "workspace_limit", "lots"),      # bad byte string
    ("workspace_limit = -5", "workspace_limit", "-5"),
    ('autotune = "yes"', "autotune", "yes"),                      # wrong type
    ('[prefer]\nconvolution = ["fft"]', "prefer.convolution", "fft"),  # unknown op key
    ('[prefer]\nconv = []', "prefer.conv", "[]"),                 # empty list
    ('[prefer]\nconv = [3]', "prefer.conv", "3"),
    ('[force]\nconv1 = 3', "force.conv1", "3"),
    ("exclude = [1]", "exclude", "1"),
])
def test_toml_bad_input_names_key_value_and_file(tmp_path, text, key, value):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as e:
        LoweringPolicy.from_toml(path)
    msg = str(e.value)
    assert str(path) in msg and key in msg and value in msg


def test_toml_syntax_error_and_missing_file(tmp_path):
    bad = write(tmp_path, "autotune = = true")
    with pytest.raises(PolicyError, match="not valid TOML") as e:
        LoweringPolicy.from_toml(bad)
    assert str(bad) in str(e.value)
    with pytest.raises(PolicyError, match="cannot be read"):
        LoweringPolicy.from_toml(tmp_path / "missing.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfeautotune = true")
    with pytest.raises(PolicyError, match="not UTF-8") as e:
        LoweringPolicy.from_toml(binary)
    assert str(binary) in str(e.value)


@pytest.mark.parametrize("text, expected", [
    (1024, 1024), ("1KiB", 1024), ("2GB", 2 * 10**9), ("1.5MiB", 3 * 2**19), ("0", 0), (None, None),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("value", ["1.2.3MiB", "..", ".", "1e", float("inf"), float("nan"), 1e400,
                                   "1e400", "1e400MiB", "inf", "nan", -1.0, [1]])
def test_malformed_or_infinite_workspace_limits_are_policy_errors_naming_the_key(value):
    with pytest.raises(PolicyError, match=r"workspace_limit="):
        LoweringPolicy(workspace_limit=value)


@pytest.mark.parametrize("text", ["workspace_limit = inf", "workspace_limit = nan",
                                  "workspace_limit = 1e400", 'workspace_limit = "1.2.3MiB"'])
def test_toml_infinite_workspace_limit_names_file_and_key(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError, match=r"workspace_limit=") as e:
        LoweringPolicy.from_toml(path)
    assert str(path) in str(e.value)


def test_parse_bytes_reads_numpy_numbers_and_exponents():
    assert parse_bytes(np.int64(4096)) == 4096 and parse_bytes("1.5e3") == 1500
    assert parse_bytes(".5KiB") == 512


def test_preferred_concatenates_most_specific_first():
    p = LoweringPolicy(prefer={"*": ["reference"], "conv": ["fft"], "conv_wgrad": ["winograd"],
                               "Conv2dBackwardFilter": ["gemm"]})
    assert p.preferred("Conv2dBackwardFilter") == ("gemm", "winograd", "fft", "reference")
    assert p.preferred("Conv2d") == ("fft", "reference")
    assert p.preferred("Relu") == ("reference",)


def test_op_keys_are_case_insensitive():
    assert LoweringPolicy(prefer={"conv2d": "fft"}).preferred("Conv2d") == ("fft",)


def test_order_appends_the_device_default():
    p = LoweringPolicy(prefer={"conv": ["winograd"]})
    assert p.order("Conv2d", "cpu") == ("winograd", "gemm", "direct", "fft", "fft-chunked")
    assert p.order("Relu", "cpu") == ("reference",)
    assert p.order("Conv2d", "cuda")[:2] == ("winograd", "cudnn")
    assert LoweringPolicy().order("Relu", "cuda") == ("codegen", "cuda", "cublas", "reference")
    assert DEFAULT_ORDER["cpu"]["conv"][0] == "gemm"


def test_exact_force_key_beats_pattern():
    p = LoweringPolicy(force={"conv*": "fft", "conv2": "gemm"})
    assert p.forced("conv2") == "gemm" and p.forced("conv3") == "fft"


def test_exclusion_by_name_tag_and_optional():
    p = LoweringPolicy(exclude=["fast"], include=["extra"])
    assert "excluded" in p.exclusion("fft", {"fft", "fast"})
    assert p.exclusion("gemm", {"gemm"}) is None
    assert "opt-in" in LoweringPolicy().exclusion("extra", {"optional"})
    assert p.exclusion("extra", {"optional"}) is None


def test_from_cli_grammar():
    p = LoweringPolicy.from_cli("conv=fft+gemm, pool=reference, @conv2=winograd, exclude=direct, conv=direct")
    assert p.prefer["conv"] == ("fft", "gemm", "direct")
    assert p.prefer["pool"] == ("reference",)
    assert p.forced("conv2") == "winograd"
    assert p.exclude == {"direct"} and not p.autotune
    bare = LoweringPolicy.from_cli("gemm")
    assert bare.preferred("Conv2d") == ("gemm",)
    assert LoweringPolicy.from_cli("auto").autotune
    assert LoweringPolicy.from_cli(None, autotune=True, precision="bf16",
                                   workspace_limit="1GiB").workspace_limit == 2**30


@pytest.mark.parametrize("spec, needle", [("conv=", "conv="), ("nonsense=fft", "nonsense"),
                                          ("conv=f f", "f f")])
def test_from_cli_errors_name_the_item(spec, needle):
    with pytest.raises(PolicyError) as e:
        LoweringPolicy.from_cli(spec)
    assert needle in str(e.value)


@pytest.mark.parametrize("spec, key, close", [("auto,includ=fused-reference", "includ", "'include'"),
                                              ("exlude=winograd", "exlude", "'exclude'"),
                                              ("convv=fft", "convv", "'conv' or 'Conv2d'")])
def test_a_misspelt_item_key_is_an_unknown_key_not_an_unknown_algorithm(spec, key, close):
    """Fresh-user report: ``includ=fused-reference`` said "unknown algorithm
    'fused-reference'": the misspelt key was read as prefer's op key and its
    value as algorithms. The key is checked first, with the close known keys."""
    with pytest.raises(PolicyError) as e:
        LoweringPolicy.from_cli(spec)
    msg = str(e.value)
    assert f"unknown key {key!r} (did you mean {close}" in msg and "unknown algorithm" not in msg, msg
    assert "known keys: include, exclude, @NODE (force), or for prefer an op name" in msg
    # every key accepted before still is: op names in any case, aliases, '*', force, include / exclude
    p = LoweringPolicy.from_cli("Conv2D=fft,pool=reference,*=gemm,@conv2:forward=fft,include=fused-reference,"
                                "exclude=winograd,auto")
    assert p.prefer["Conv2D"] == ("fft",) and p.prefer["*"] == ("gemm",) and dict(p.force) == {"conv2:forward": "fft"}
    assert p.include == {"fused-reference"} and p.exclude == {"winograd"} and p.autotune


def test_cli_flags_go_before_the_file(tmp_path):
    path = write(tmp_path, '[prefer]\nconv = ["gemm", "fft"]\n[force]\nconv1 = "direct"\n')
    p = LoweringPolicy.from_cli("conv=fft", policy_file=path, precision="fp16")
    assert p.prefer["conv"] == ("fft", "gemm")
    assert p.forced("conv1") == "direct" and p.precision == "fp16"


def test_cli_strings(tmp_path):
    """What the benchmark CLI passes (``add_cli_arguments`` is gone: the CLI
    declares its own flags and calls ``from_cli``)."""
    path = write(tmp_path, "exclude = ['winograd']\n")
    p = LoweringPolicy.from_cli("conv=fft", policy_file=str(path), autotune=True, precision="tf32",
                                workspace_limit="64MiB")
    assert p.prefer["conv"] == ("fft",) and p.exclude == {"winograd"}
    assert p.autotune and p.precision == "tf32" and p.workspace_limit == 64 * 2**20
    assert LoweringPolicy.from_cli() == LoweringPolicy()


def test_policy_is_frozen_and_compared_by_value():
    a = LoweringPolicy(prefer={"conv": ["fft"]})
    assert a == LoweringPolicy(prefer={"conv": "fft"})
    with pytest.raises(AttributeError):
        a.autotune = True
    with pytest.raises(TypeError):
        a.prefer["conv"] = ("gemm",)


def test_unknown_algorithm_names_are_errors_but_tags_may_be_excluded():
    with pytest.raises(PolicyError, match="unknown algorithm 'wino'"):
        LoweringPolicy(prefer={"conv": ["wino"]})
    with pytest.raises(PolicyError, match="unknown algorithm 'fftt'"):
        LoweringPolicy.from_cli("conv=fftt")
    assert LoweringPolicy.from_cli("exclude=fused").exclude == {"fused"}  # a rule tag


@pytest.mark.parametrize("make, named, close", [
    (lambda: LoweringPolicy(prefer={"conv": ["winogard"]}), "prefer.conv", "winograd"),
    (lambda: LoweringPolicy.from_cli("@conv1=fftt"), "--lowering @conv1", "fft"),
    (lambda: LoweringPolicy(prefer={"convv": ["fft"]}), "prefer.convv", "conv"),
    (lambda: LoweringPolicy.from_mapping({"autotun": True}), "policy: autotun", "autotune")])
def test_an_unknown_name_suggests_the_close_known_ones(make, named, close):
    """Fresh-user report: no 'did you mean' for a misspelt algorithm, op
    alias or policy key; the error still names the parameter and the value."""
    with pytest.raises(PolicyError) as e:
        make()
    assert str(e.value).startswith(f"parameter {named}") and f"(did you mean {close!r}" in str(e.value)


def test_force_key_matching_no_node_warns():
    import opgraph as og
    g = og.Graph()
    x, w = g.input("x", (1, 1, 4, 4)), g.param("w", (1, 1, 3, 3))
    y = og.conv2d(x, w, name="c")
    with pytest.warns(UserWarning, match="'nosuch' matches no node"):
        og.compile([y], policy=LoweringPolicy(force={"nosuch": "fft"}))


def test_layout_is_case_insensitive_like_the_cli(tmp_path):
    p = LoweringPolicy.from_toml(write(tmp_path, 'layout = "nhwc"'))
    assert p.layout == "NHWC"
    with pytest.raises(PolicyError, match="layout"):
        LoweringPolicy(layout="chwn")


#: The aliases as policy.py spelled them out before ops declared their family.
EARLIER_ALIASES = {
    "conv": {"Conv2d", "Conv2dBackwardData", "Conv2dBackwardFilter"},
    "conv_fwd": {"Conv2d"}, "conv_dgrad": {"Conv2dBackwardData"}, "conv_wgrad": {"Conv2dBackwardFilter"},
    "pool": {"MaxPool2d", "MaxPool2dBackward", "MaxPool2dBackwardRelu", "MaxPool2dSelect", "AvgPool2d",
             "AvgPool2dBackward"},
    "relu": {"Relu", "ReluBackward", "Threshold", "ThresholdBackward"},
    "lrn": {"LocalResponseNorm", "LocalResponseNormBackward"},
    "linear": {"Linear", "MatMul"},
    "softmax": {"Softmax", "SoftmaxBackward", "LogSoftmax", "LogSoftmaxBackward", "CrossEntropy",
                "CrossEntropyBackward"},
}

#: ops that joined an alias since (the pool-argmax and pool-scan rules' saved-winner ops, 2026-12-04;
#: the relu-bias-sums rule's ReLU gradient and the slot of its sums)
LATER_ALIASES = {"pool": {"MaxPool2dArgmax", "MaxPool2dTake", "MaxPool2dBackwardIndices", "MaxPool2dArgmaxSlot",
                          "MaxPool2dScan"},
                 "relu": {"ReluBackwardSumsSlot", "ReluBackwardSums"}}


def test_aliases_are_the_ops_family_declarations():
    """Every alias comes from ``Op.family`` / ``Op.direction`` (an op added to
    ``opgraph.ops`` gets its alias from its own class); the aliases the
    policy spelled out before keep their ops, and the fused convolutions
    join ``conv`` and their direction's alias (``conv_fwd``, ``conv_dgrad``)."""
    from opgraph import ops
    from opgraph.passes.policy import ALIASES, CONV_OPS

    for name in ops.__all__:
        op = getattr(ops, name)
        assert name in ALIASES[op.family] and name in ALIASES["*"]
        if op.direction is not None:
            assert name in ALIASES[f"{op.family}_{op.direction}"]
    fused = {t.__name__: t.direction for t in ops.of_family("conv") if t.fused}
    assert {"Conv2dBiasRelu", "Conv2dBiasActivation", "Conv2dBackwardDataRelu"} <= set(fused)
    for alias, names in EARLIER_ALIASES.items():
        joined = {n for n, d in fused.items() if alias in ("conv", f"conv_{d}")} | LATER_ALIASES.get(alias, set())
        assert set(ALIASES[alias]) - names == joined
        assert names <= set(ALIASES[alias])
    assert CONV_OPS == ALIASES["conv"] == tuple(t.__name__ for t in ops.of_family("conv"))
    assert ops.of_family("conv", "wgrad") == (ops.Conv2dBackwardFilter,)
    # an alias spelled like an op name (keys are case-insensitive) covers that op
    for alias, names in ALIASES.items():
        assert {n for n in ops.__all__ if n.lower() == alias} <= set(names)


def test_the_default_order_follows_the_family():
    p = LoweringPolicy()
    assert p.order("Conv2dBiasRelu", "cpu") == DEFAULT_ORDER["cpu"]["conv"]
    assert p.order("MaxPool2dBackwardRelu", "cuda") == DEFAULT_ORDER["cuda"]["*"]


def test_a_name_both_included_and_excluded_is_refused():
    """Exclude used to win without a word; the contradiction is the user's to resolve."""
    with pytest.raises(PolicyError, match=r"exclude=\['bn-stats-parts'\]: also in include"):
        LoweringPolicy(include=["bn-stats-parts", "fft"], exclude=["bn-stats-parts"])


@pytest.mark.parametrize("typo", ["of", "of ", "oof"])
def test_a_cache_value_a_letter_from_off_is_a_policy_error(typo):
    """Fresh-user report: ``cache = "of"`` quietly started a cache file ``./of``."""
    with pytest.raises(PolicyError, match=r"cache=.*: not 'off' .*\(did you mean 'off'\?\)"):
        LoweringPolicy(cache=typo)


@pytest.mark.parametrize("value", ["off", "OFF", "tuned.json", "cache-dir/of.json", "of.json.gz", "OF.JSON"])
def test_off_and_json_paths_stay_cache_values(value):
    assert LoweringPolicy(cache=value).cache == value


@pytest.mark.parametrize("value, message", [
    ("64M", r"\(did you mean 'MB'\?\)"),
    ("64Mi", r"\(did you mean 'MiB'\?\)"),
    ("12XB", r"unknown unit 'XB' \(units"),  # said (did you mean 'B'?): the bare B is never offered
    ("3gig", r"unknown unit 'gig' \(did you mean 'GiB'\?\)"),  # any case is read, so compared in any case
    ("-1", r"must be >= 0"),                  # said "must be bytes" (fresh-user report)
    ("-2GiB", r"must be >= 0"),
])
def test_a_near_unit_is_suggested_and_a_negative_size_named(value, message):
    with pytest.raises(PolicyError, match=message):
        parse_bytes(value)


@pytest.mark.parametrize("make, named, close", [
    (lambda: LoweringPolicy(explicit_padding=["gemmm"]), "explicit_padding", "gemm"),
    (lambda: LoweringPolicy.from_mapping({"explicit_padding": ["*", "fftt"]}), "policy: explicit_padding", "fft"),
])
def test_an_unknown_explicit_padding_algorithm_is_refused(make, named, close):
    """Fresh-user report: ``explicit_padding=['gemmm']`` was accepted (and padded
    nothing) while ``prefer`` and ``force`` refuse an unknown algorithm."""
    with pytest.raises(PolicyError, match="unknown algorithm") as e:
        make()
    assert str(e.value).startswith(f"parameter {named}=") and f"(did you mean {close!r}" in str(e.value)
    assert LoweringPolicy(explicit_padding=["*", "gemm"]).explicit_padding == {"*", "gemm"}


@pytest.mark.parametrize("value", [1.5, np.float64(0.25), "1.5", "2.5B"])
def test_a_fraction_of_a_byte_is_refused(value):
    """Fresh-user report: ``workspace_limit=1.5`` was accepted as a limit of 1 byte
    (1.5 GiB was meant); a size with a larger unit is still rounded down to bytes."""
    with pytest.raises(PolicyError, match=r"workspace_limit=.*: must be a whole number of bytes.*'[0-9.]+GiB'"):
        LoweringPolicy(workspace_limit=value)
    assert parse_bytes(2.0) == 2 and parse_bytes("1.5GiB") == 3 * 2**29 and parse_bytes("1.1KiB") == 1126


@pytest.mark.parametrize("key, word, close", [
    ("c:forwards", "forwards", "'forward'"), ("conv2:Forward", "Forward", "'forward'"),
    ("conv2:fwd", "fwd", "'forward'"), ("conv2:dgrad", "dgrad", "'backward_data'"),
    ("conv2:backward_filtr", "backward_filtr", "'backward_filter'")])
def test_a_misspelt_force_direction_is_refused(key, word, close):
    """Fresh-user report: ``force={'c:forwards': ...}`` only warned at compile time
    that the key matched no node: it read as a node named ``c:forwards``."""
    with pytest.raises(PolicyError, match=rf"force\.{key}='fft': unknown direction '{word}' \(did you mean {close}"):
        LoweringPolicy(force={key: "fft"})


def test_a_colon_far_from_any_direction_is_left_to_node_names():
    """A node's name may hold ``:`` (ONNX's ``conv1:0``): only a word close to a
    direction is refused; on the command line the flag is named."""
    assert LoweringPolicy(force={"conv1:0": "gemm", "c:backward_data": "gemm"}).force["conv1:0"] == "gemm"
    with pytest.raises(PolicyError, match=r"^parameter --lowering: force\.conv2:forwrd='fft': unknown direction"):
        LoweringPolicy.from_cli("@conv2:forwrd=fft")
