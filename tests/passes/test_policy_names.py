"""A policy's include / exclude must name an algorithm, a rule tag or a fusion
rule: a typo ('winogard') was accepted silently and Winograd kept running
(fresh-user run, 2026-12-02)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.passes.policy import LoweringPolicy, PolicyError
from opgraph.passes.policy_names import known_names


def _conv():
    g = og.Graph("c")
    x, w = g.input("x", (1, 2, 6, 6)), g.param("w", (3, 2, 3, 3))
    return og.conv2d(x, w, padding=1)


@pytest.mark.parametrize("key, name", [("exclude", "winogard"), ("include", "nosuch")])
def test_an_unknown_name_is_a_policy_error_naming_key_and_name(key, name):
    with pytest.raises(PolicyError, match=rf"{key}.*{name}.*names no algorithm"):
        og.compile([_conv()], policy={key: [name]})


@pytest.mark.parametrize("name", ["winograd", "fused", "gemm", "elementwise", "gradient-sum",
                                  "conv-epilogue", "fused-reference"])
def test_algorithms_tags_and_fusion_rules_are_known(name):
    assert name in known_names()
    og.compile([_conv()], policy={"exclude": [name]} if name != "gemm" else {"include": [name]})


def test_the_cli_exits_2_naming_the_unknown_exclusion(capsys):
    from opgraph.benchmarks.cli import main
    with pytest.raises(SystemExit) as e:  # an argparse error, as the flag is parsed
        main(["--model", "L1", "--batch", "1", "--lowering", "exclude=nosuch", "--quiet"])
    assert e.value.code == 2 and "nosuch" in capsys.readouterr().err


def test_a_preference_without_an_implementation_on_the_device_is_noted():
    """``prefer conv=unfold`` on the CPU (unfold runs on cuda only) can never be a
    candidate: the compile says so instead of ignoring it silently."""
    from opgraph.passes.policy_names import preferences_elsewhere

    g = og.Graph()
    x = g.input("x", (1, 3, 8, 8))
    w = g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, padding=1)
    exe = og.compile(y, device="cpu", policy=LoweringPolicy(prefer={"conv": ["unfold", "gemm"]}))
    (line,) = [n for n in exe.report.notes if n.startswith("policy prefer")]
    assert "conv=unfold (runs on cuda)" in line and "no implementation on cpu" in line
    assert preferences_elsewhere(LoweringPolicy(prefer={"conv": ["gemm"]}), "cpu") == []
    assert preferences_elsewhere(LoweringPolicy(prefer={"conv": ["unfold"]}), "cuda") == []


def test_an_include_that_turns_nothing_on_is_noted(monkeypatch):
    """No rule is opt-in today: ``include=['depthwise-wgrad']`` (opt-in until the
    twelfth session) has no effect, which the compile says, and so does a fusion
    rule's name (``pool-scan`` and ``relu-bias-sums`` were opt-in until
    2026-12-05; every fusion rule runs unless excluded); ``fused-reference`` and
    the tag of an opt-in rule do something, and are not noted."""
    import attrs

    from opgraph.backends import registry
    from opgraph.passes.policy_names import idle_includes

    g = og.Graph()
    x = g.input("x", (1, 3, 8, 8))
    w = g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, padding=1)
    exe = og.compile(y, device="cpu", policy=LoweringPolicy(include=["depthwise-wgrad", "fused-reference"]))
    (line,) = [n for n in exe.report.notes if n.startswith("policy include")]
    assert "['depthwise-wgrad']" in line and "no effect" in line
    assert idle_includes(LoweringPolicy(include=["fused-reference"])) == []
    assert idle_includes(LoweringPolicy(include=["relu-bias-sums", "pool-scan", "elementwise"])) == \
        ["elementwise", "pool-scan", "relu-bias-sums"]
    rules = dict(registry._RULES[og.ops.Conv2d])
    rules["extra"] = attrs.evolve(rules["gemm"], algorithm="extra", tags={"optional", "xtag"})
    monkeypatch.setitem(registry._RULES, og.ops.Conv2d, rules)
    assert idle_includes(LoweringPolicy(include=["xtag", "extra", "gemm"])) == ["gemm"]



def test_an_unknown_name_suggests_close_names_and_lists_no_internal_tag():
    """Fresh-user report: ``exclude=winogard`` offered no 'did you mean', and the
    known names listed ``option:precision``, ``variants:engine_limit`` and
    ``symmetric_padding_only``: tags that tell the passes how to pad for a rule
    and call it, no group of rules to turn off. They still match (as any tag)."""
    from opgraph.backends.registry import registered_tags
    from opgraph.passes.candidates import CONTRACT_TAGS
    from opgraph.passes.policy_names import listed_names

    assert registered_tags() & CONTRACT_TAGS  # the premise: some rule carries one
    with pytest.raises(PolicyError) as e:
        og.compile([_conv()], policy={"exclude": ["winogard"]})
    msg = str(e.value)
    assert "exclude='winogard'" in msg and "(did you mean 'winograd'?)" in msg
    listed = set(msg.split("; known: ", 1)[1].split(", "))
    assert listed == listed_names() and not listed & CONTRACT_TAGS
    assert {"winograd", "fast", "fused", "fused-reference", "elementwise"} <= listed
    with pytest.raises(PolicyError) as e:
        og.compile([_conv()], policy={"include": ["zzzzzz"]})
    assert "include='zzzzzz'" in str(e.value) and "did you mean" not in str(e.value)
    og.compile([_conv()], policy={"exclude": sorted(registered_tags() & CONTRACT_TAGS)})


def test_the_cli_suggests_the_close_name_naming_the_flag(capsys):
    from opgraph.benchmarks.cli import main
    with pytest.raises(SystemExit) as e:
        main(["--model", "L4", "--batch", "1", "--device", "cpu", "--lowering", "auto,exclude=winogard"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--lowering" in err and "exclude='winogard'" in err and "did you mean 'winograd'" in err


@pytest.mark.parametrize("include, exclude, by", [
    (["fused-reference"], ["fused"], ["fused"]),       # 'fused' turns every fusion rule off
    (["fused-reference", "pool-scan"], ["fused"], ["fused"]),  # the opt-in still, beside an idle name
    (["gemm"], ["im2col"], ["im2col"]),                # a tag of every gemm rule
    (["fast"], ["fft", "winograd"], ["fft", "winograd"])])  # a tag's rules, excluded by name
def test_an_include_that_exclude_covers_through_other_names_is_refused(include, exclude, by):
    """Fresh-user report: ``include=fused-reference`` beside ``exclude=fused``
    was accepted and exclude won, silently; the same name in both was already
    refused (``LoweringPolicy``). Both errors name both keys."""
    with pytest.raises(PolicyError) as e:
        og.compile([_conv()], policy={"include": include, "exclude": exclude})
    msg = str(e.value)
    refused = include[:1]
    assert msg.startswith(f"parameter exclude={by!r}: covers include={refused!r}: it turns off every rule"), msg
    assert msg.endswith("and exclude would win: a rule may be in one of them")
    with pytest.raises(PolicyError, match=rf"exclude={include!r}: also in include={include!r}".replace("[", r"\[")):
        LoweringPolicy(include=include, exclude=include)


@pytest.mark.parametrize("include, exclude", [(["pool-scan"], ["fused"]), (["relu-bias-sums"], ["fused"]),
                                              (["pool-scan", "relu-bias-sums"], ["fused"])])
def test_a_fusion_rules_name_beside_an_exclude_that_covers_it_is_noted_not_refused(include, exclude):
    """``include=['pool-scan']`` was refused beside ``exclude=['fused']`` although
    the include does nothing since the rule became a default (2026-12-05): every
    fusion rule runs unless excluded. Exclude wins, as it would without the
    include, and the note says which exclude turns the rule off."""
    exe = og.compile([_conv()], device="cpu", policy={"include": include, "exclude": exclude})
    (note,) = [n for n in exe.report.notes if n.startswith("policy include")]
    assert note.startswith(f"policy include {include}: no effect: include turns on only the lowering rules "
                           "tagged 'optional', the fusion rules not yet run on a GPU (ln-backward-sums) by their "
                           "names, and, by the name 'fused-reference', the fusion rules"), note
    assert "tagged 'optional' and 'fused-reference'" not in note  # fused-reference is no tag
    # on the CPU the generated-kernel rules wait for fused-reference: the note said every fusion rule ran
    assert "on the CPU's oracle kernels, those only with include=['fused-reference']" in note
    assert note.endswith("".join(f"; exclude=['fused'] turns {name} off" for name in include))


@pytest.mark.parametrize("include, exclude", [(["im2col"], ["gemm"]),  # unfold is left
                                              (["fused-reference"], ["elementwise"]),  # pool-argmax is left
                                              (["cudnn"], ["fused"])])  # the unfused convolutions are left
def test_an_exclude_that_leaves_a_rule_of_the_include_is_no_contradiction(include, exclude):
    og.compile([_conv()], policy={"include": include, "exclude": exclude})


def test_the_cli_refuses_an_include_its_policy_file_excludes(tmp_path, capsys):
    from opgraph.benchmarks.cli import main
    path = tmp_path / "policy.toml"
    path.write_text('exclude = ["fused"]\n')
    assert main(["--model", "L4", "--batch", "1", "--device", "cpu", "--policy", str(path),
                 "--lowering", "gemm,include=fused-reference", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--policy {path}: exclude=['fused']: covers include=['fused-reference']" in err, err


def test_a_record_repeats_the_note_on_a_preference_that_does_nothing():
    """``--lowering gemm,LayerNorm=codegen`` on the CPU said only "applied to every column": the
    compile's note that codegen has no CPU kernel now reaches the benchmark record
    (``requested_notes``) and the table's notes (``no effect``); an idle include is said once, in
    the run's notes (``tests/benchmarks/test_cli.py``), not again per record."""
    from benchmarks.lowerings import requested_notes
    from benchmarks.tables import warning_notes
    g = og.Graph("g")
    y = og.layer_norm(g.input("x", (2, 3, 8)), 8)
    exe = og.compile(y, device="cpu", policy={"prefer": {"LayerNorm": ["codegen"]}, "include": ["gemm"]})
    notes = requested_notes(exe, "fp32", "NCHW", "float32")
    assert any(n.startswith("policy prefer LayerNorm=codegen (runs on cuda): no implementation on cpu")
               for n in notes), notes
    assert not any(n.startswith("policy include") for n in notes), notes
    shown = warning_notes({"model": "m", "lowering": "gemm", "notes": notes})
    assert len(shown) == 1 and shown[0].startswith("m / gemm: policy prefer LayerNorm=codegen")
