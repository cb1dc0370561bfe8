"""``scripts/kernel_sass.py``: its reading of a SASS listing (no tools needed),
and, where NVIDIA's compiler wheels are installed (no GPU needed), what ptxas
makes of the batch-norm statistics' loop: one 16-byte load in flight per
iteration with one row a step, two with ``ROW_LOAD_BYTES`` (which ptxas at
first undid: docs/performance.md, "rows in flight"); its arguments."""

from __future__ import annotations

import pytest

from opgraph import ops
from opgraph.types import TensorType

from repo_scripts import load_script

LISTING = """
        /*0590*/                   LDG.E.128.CONSTANT R8, desc[UR8][R10.64] ;
        /*05a0*/                   LDG.E.128.CONSTANT R12, desc[UR8][R12.64] ;
        /*05f0*/                   FADD R35, R8, -R31 ;
        /*0600*/                   LDG.E.128.CONSTANT R16, desc[UR8][R20.64] ;
        /*0610*/              @!P2 BRA 0x590 ;
        /*0620*/                   LDG.E.128.CONSTANT R8, desc[UR8][R8.64] ;
        /*0630*/                   LDG.E.CONSTANT R9, desc[UR8][R2.64] ;
        /*0640*/                   FFMA R1, R2, R3, R4 ;
        /*0650*/               @P0 BRA 0x700 ;
        /*0660*/                   EXIT ;
"""


def test_loads_before_the_first_float_instruction_of_each_loop():
    script = load_script("kernel_sass")
    sass = script.parse_sass(LISTING)
    assert sass[0] == (0x590, "LDG.E.128.CONSTANT R8, desc[UR8][R10.64]") and len(sass) == 10
    # the one loop (0x590-0x610): two loads, then arithmetic; the loads after it are no loop's
    assert script.loads_together(sass) == 2
    assert script.loads_together(sass[5:]) == 0  # a forward branch is no loop


def test_the_statistics_loop_issues_its_rows_loads_together(monkeypatch):
    script = load_script("kernel_sass")
    try:
        compiler = script.Compiler()
    except SystemExit as e:
        pytest.skip(str(e))
    if compiler.cuobjdump is None:
        pytest.skip("no cuobjdump and nvdisasm wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    from opgraph.backends.cuda.codegen import plan
    op = ops.BatchNormStats()
    found = {}
    for dtype in ("float32", "bfloat16"):
        x = TensorType((128, 256, 56, 56), dtype, "NHWC")
        for row_bytes in (0, 32):
            monkeypatch.setattr(plan, "ROW_LOAD_BYTES", row_bytes)
            got = compiler.compile(plan.lower(op, [x], op.infer(x)).launches[0].source)
            found[dtype, row_bytes] = (got["loads"], got["spill_bytes"])
    assert found == {("float32", 0): (1, 0), ("float32", 32): (2, 0),
                     ("bfloat16", 0): (1, 0), ("bfloat16", 32): (2, 0)}, found


@pytest.mark.parametrize("text", ["abc", "", "0,,32", "-16"])
def test_a_bad_row_bytes_value_is_a_usage_error(capsys, text):
    script = load_script("kernel_sass")
    with pytest.raises(SystemExit) as e:
        script.main(["--row-bytes", text])
    assert e.value.code == 2 and "--row-bytes" in capsys.readouterr().err
