"""A run on the GPU without the cuDNN frontend (or nvmath-python) says so in
its notes and on stderr: ``auto`` falls back to gemm / fft convolutions,
several times slower, and must not pass for a cuDNN run."""

from __future__ import annotations

from opgraph.backends.cuda import cublas, cudnn_rules
from opgraph.benchmarks import cli
from opgraph.benchmarks.environment import missing_gpu_libraries


def test_a_missing_frontend_is_a_note_and_a_warning(monkeypatch, capsys):
    monkeypatch.setattr(cudnn_rules, "environment_reason", lambda: "the cuDNN frontend cannot be imported (x)")
    monkeypatch.setattr(cublas, "capture_requirement", lambda: "nvmath-python is not installed (y)")
    notes = cli.gpu_library_notes("cuda")
    assert notes == ["cudnn unavailable: the cuDNN frontend cannot be imported (x)",
                     "cuBLAS not capturable: nvmath-python is not installed (y)"]
    err = capsys.readouterr().err
    assert "warning: cudnn unavailable" in err and "warning: cuBLAS not capturable" in err


def test_nothing_is_said_when_both_import_or_on_the_cpu(monkeypatch):
    monkeypatch.setattr(cudnn_rules, "environment_reason", lambda: None)
    monkeypatch.setattr(cublas, "capture_requirement", lambda: None)
    assert missing_gpu_libraries("cuda") == []
    monkeypatch.setattr(cudnn_rules, "environment_reason", lambda: "no GPU")
    assert missing_gpu_libraries("cpu") == []
