"""Every real-valued op parameter refuses NaN, and infinity where a finite
value is meant, with a ParameterError naming the node, the parameter and the
value (a range check alone lets NaN through: every comparison with it is false)."""

import math

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import ParameterError

#: (op class name, field) where an infinity has a meaning: -inf padding, a one-sided clip.
INFINITE_OK = {("Pad", "value"), ("Hardtanh", "min_val"), ("Hardtanh", "max_val"),
               ("HardtanhBackward", "min_val"), ("HardtanhBackward", "max_val")}


def _real_fields():
    for name in ops.__all__:
        cls = getattr(ops, name)
        if not attrs.has(cls):
            continue
        for f in attrs.fields(cls):
            if getattr(f.converter, "__qualname__", "").startswith("_real."):
                yield name, f


REAL_FIELDS = list(_real_fields())


def test_the_survey_finds_the_real_fields():
    names = {(op, f.name) for op, f in REAL_FIELDS}
    assert {("Dropout", "p"), ("BatchNorm", "eps"), ("BatchNormRunningUpdate", "momentum"),
            ("LocalResponseNorm", "alpha"), ("Threshold", "threshold"), ("LayerNorm", "eps")} <= names


@pytest.mark.parametrize("op_name, field", REAL_FIELDS, ids=[f"{o}.{f.name}" for o, f in REAL_FIELDS])
def test_nan_and_infinity_are_refused(op_name, field):
    convert = field.converter
    with pytest.raises(ParameterError, match=rf"{field.name}=nan: must be a number, not NaN"):
        convert(float("nan"))
    with pytest.raises(ParameterError, match=field.name):
        convert(np.float32("nan"))
    for inf in (math.inf, -math.inf):
        if (op_name, field.name) in INFINITE_OK:
            assert convert(inf) == inf
        elif field.default is not attrs.NOTHING:  # a bound check may say it first; either names it
            with pytest.raises(ParameterError, match=rf"{field.name}=-?inf"):
                convert(inf)


def _x(shape=(2, 3, 4, 4)):
    g = og.Graph()
    return g, g.input("x", shape)


@pytest.mark.parametrize("build, param", [
    (lambda: og.dropout(_x()[1], p=float("nan"), training=True, name="d1"), "p=nan"),
    (lambda: og.dropout(_x()[1], p=math.inf, training=True, name="d1"), "p=inf"),
    (lambda: og.local_response_norm(_x()[1], 3, alpha=float("nan"), name="d1"), "alpha=nan"),
    (lambda: og.local_response_norm(_x()[1], 3, beta=math.inf, name="d1"), "beta=inf"),
    (lambda: og.threshold(_x()[1], float("nan"), 0.0, name="d1"), "threshold=nan"),
    (lambda: og.hardsigmoid(_x()[1], alpha=math.inf, name="d1"), "alpha=inf"),
    (lambda: og.hardtanh(_x()[1], float("nan"), 1.0, name="d1"), "min_val=nan"),
    (lambda: og.pad(_x()[1], 1, value=float("nan"), name="d1"), "value=nan"),
])
def test_builders_name_node_parameter_and_value(build, param):
    with pytest.raises(ParameterError, match=rf"node d1 .*{param}"):
        build()


def _bn(**kw):
    g, x = _x()
    rm, rv = g.buffer("rm", (3,), value=0.0), g.buffer("rv", (3,), value=1.0)
    return og.batch_norm(x, rm, rv, **kw, name="bn1")


@pytest.mark.parametrize("kw, param", [
    (dict(eps=float("nan")), "eps=nan"), (dict(eps=math.inf), "eps=inf"),
    (dict(eps=float("nan"), training=True, return_running_stats=True), "eps=nan"),
    (dict(momentum=float("nan"), training=True, return_running_stats=True), "momentum=nan"),
    (dict(momentum=math.inf, training=True, return_running_stats=True), "momentum=inf"),
    # momentum is unused here, yet a NaN must not pass silently
    (dict(momentum=float("nan")), "momentum=nan"),
])
def test_batch_norm_eps_and_momentum(kw, param):
    with pytest.raises(ParameterError, match=rf"node bn1.*{param}"):
        _bn(**kw)


def test_layer_norm_eps():
    g, x = _x()
    with pytest.raises(ParameterError, match=r"node ln1 .*eps=nan"):
        og.layer_norm(x, (4, 4), eps=float("nan"), name="ln1")


def test_infinite_padding_and_clip_still_work():
    g, x = _x()
    y = og.pad(x, 1, value=-math.inf)
    z = og.hardtanh(x, -math.inf, 0.5)
    xv = np.arange(96, dtype=np.float32).reshape(2, 3, 4, 4) / 96
    yv, zv = og.compile([y, z])(x=xv)
    assert yv[0, 0, 0, 0] == -math.inf and np.array_equal(zv, np.minimum(xv, 0.5))
