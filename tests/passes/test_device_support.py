"""compile reaches the devices only through the registry's device interface
(``registry.device_support``), which ``backends/device.py`` registers."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends import device
from opgraph.backends.registry import DeviceSupport, device_support, register_devices
from opgraph.passes.compiler import make_context
from opgraph.passes.policy import LoweringPolicy

GPU_OK, GPU_WHY = device.cuda_status()


def test_the_device_module_registers_its_functions():
    support = device_support()
    assert support.resolve is device.resolve_device and support.array_module is device.array_module
    assert support.versions is device.versions and support.device_name is device.device_name


def test_auto_resolves_through_the_registry_and_says_why():
    ctx = make_context("auto", LoweringPolicy(), None)
    assert ctx.device == ("cuda" if GPU_OK else "cpu")
    assert ctx.report.notes[0] == f"device: {ctx.device} (auto: {GPU_WHY}" + \
        ("" if GPU_OK else "; falling back to the CPU") + ")"


@pytest.mark.skipif(GPU_OK, reason="a GPU is present")
def test_cuda_without_a_gpu_is_the_device_backends_error():
    g = og.Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(device.DeviceUnavailableError, match="device 'cuda' is unavailable"):
        og.compile(og.relu(x), device="cuda")


def test_compile_uses_the_registered_interface():
    asked = []

    def resolve(name):
        asked.append(name)
        return device.resolve_device("cpu")

    saved = device_support()
    register_devices(DeviceSupport(resolve=resolve, array_module=saved.array_module,
                                   versions=saved.versions, device_name=saved.device_name))
    try:
        g = og.Graph()
        x = g.input("x", (2, 3))
        run = og.compile(og.relu(x), device="somewhere")
    finally:
        register_devices(saved)
    assert asked == ["somewhere"]
    (y,) = run(x=np.array([[-1.0, 2.0, 0.5], [3.0, -4.0, 0.0]], np.float32))
    np.testing.assert_array_equal(y, [[0.0, 2.0, 0.5], [3.0, 0.0, 0.0]])


def test_only_a_device_not_given_is_called_the_default():
    """Fresh-user report: ``--device cpu`` said "cpu: the device asked for
    (opgraph.compile's default)"; a device asked for by name is no default,
    and a compile given none says that it took the CPU by default."""
    g = og.Graph()
    x = g.input("x", (2, 3))
    asked = og.compile(og.relu(x), device="cpu").report.notes[0]
    assert asked == "device: cpu (cpu: the device asked for)"
    defaulted = og.compile(og.relu(x)).report
    assert defaulted.notes[0] == "device: cpu (cpu: opgraph.compile's default, no device given)"
    assert make_context(None, LoweringPolicy(), None).device == "cpu"
