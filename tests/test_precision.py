"""The precision vocabulary (opgraph/precision.py): names, dtypes, resolution."""

import pytest

from opgraph import precision
from opgraph.errors import ParameterError
from opgraph.types import FLOAT_DTYPES


def test_every_precision_has_its_operand_and_accumulation_dtype():
    assert set(precision.IO_DTYPE) == set(precision.COMPUTE_DTYPE) == set(precision.PRECISIONS)
    assert set(precision.IO_DTYPE.values()) <= set(FLOAT_DTYPES)
    # SEMANTICS.md "Numbers": every precision accumulates in fp32
    assert set(precision.COMPUTE_DTYPE.values()) == {"float32"}
    # a storage's default precision keeps the storage as the operand type
    for storage, name in precision.DEFAULT_PRECISION.items():
        assert precision.IO_DTYPE[name] == storage


@pytest.mark.parametrize("asked, storage, got", [
    ("fp32", "float32", "fp32"), ("fp32", "float64", "fp32"), ("fp32", None, "fp32"),
    ("fp32", "bfloat16", "bf16"), ("fp32", "float16", "fp16"),  # the storage's own precision
    ("tf32", "bfloat16", "tf32"), ("fp16", "float32", "fp16"), ("bf16", "float16", "bf16"),
])
def test_resolve(asked, storage, got):
    assert precision.resolve(asked, storage) == got


@pytest.mark.parametrize("bad", ["fp8", "FP32", None, 32])
def test_an_unknown_precision_is_an_error_naming_it(bad):
    with pytest.raises(ParameterError) as e:
        precision.resolve(bad, "float32")
    assert e.value.param == "precision" and e.value.value == bad and "fp32" in e.value.why
