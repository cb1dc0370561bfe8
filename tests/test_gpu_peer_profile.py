"""``scripts/gpu_peer_profile.py`` without a GPU: its kernel groups and the per-step
arithmetic of its summary (the profile itself needs CUDA and runs in the device script)."""

from __future__ import annotations

import pytest

from repo_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("gpu_peer_profile")


@pytest.mark.parametrize("name, group", [
    # kernel names as the H200's PyTorch 2.11 profiler prints them
    ("triton_per_fused__native_batch_norm_legit_functional_relu_12", "triton"),
    ("triton_tem_fused_mm_3", "triton"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "library"),
    ("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16", "library"),
    ("void cudnn::engines_precompiled::nhwcToNchwKernel<__nv_bfloat16>", "library"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
    ("void at::native::(anonymous namespace)::max_pool_backward_nhwc<c10::BFloat16>", "other"),
])
def test_kernel_groups(script, name, group):
    assert script.kernel_group(name) == group


def test_summary_is_per_step(script):
    s = script.summarise([("triton_a", 1000.0, 10), ("sm90_xmma_b", 3000.0, 5), ("fill", 500.0, 5)], steps=5)
    assert s["step_ms"] == pytest.approx(0.9)
    assert s["groups"]["library"] == pytest.approx({"ms": 0.6, "kernels": 1.0, "share": 0.6 / 0.9})
    assert s["groups"]["triton"]["kernels"] == 2.0
    assert [r["name"] for r in s["top"]] == ["sm90_xmma_b", "triton_a", "fill"]


def test_no_steps_is_an_error(script):
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        script.summarise([], steps=0)


@pytest.mark.parametrize("name, key", [("tests/onnx/models/alexnet.onnx", "alexnet"), ("alexnet", "alexnet")])
def test_models_by_name_or_onnx_file_at_a_batch(script, name, key):
    if name.endswith(".onnx"):
        pytest.importorskip("onnx")
    model = script.build_model(name, "float32", 3)
    assert (model.key, model.batch) == (key, 3)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--model", "alexnet,nosuch"], "--model nosuch: "),
    (["--model", "nosuch.onnx"], "--model nosuch.onnx: "),
    (["--precision", "bogus"], "invalid choice: 'bogus'"),
])
def test_bad_arguments_are_usage_errors_before_anything_runs(script, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        script.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_without_a_gpu_it_says_what_it_needs(script, capsys, monkeypatch):
    monkeypatch.setattr(script, "no_cuda", lambda: "needs a CUDA GPU and a CUDA build of PyTorch; torch X sees none")
    with pytest.raises(SystemExit) as e:
        script.main(["--model", "alexnet", "--batch", "2"])
    assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
