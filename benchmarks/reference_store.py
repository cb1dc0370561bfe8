"""Where the float64 reference keeps its values: on the device up to a share
of its memory, the rest in host memory.

The reference (:class:`.check.Reference`) keeps, in float64, every value the
per-node check reads or compares. ResNet-50 at batch 128 keeps 58.8 GB
(decimal, as everywhere here). That fit the H200's 150.8 GB; on an H100's
85.0 GB, with PyTorch's float64 converter check beside it (19 GB), both
ResNet-50 runs of 2026-12-06 ran out of device memory before timing
anything. So a value is stored on the device while the values stored there
stay under :data:`DEVICE_SHARE` of the device's memory, and in host memory
past that (the outputs, small and read by every column, stay on the device
whatever the budget). Each read of a host value copies it to the device
afresh and nothing keeps the copy, so the check adds to the share only the
values of the step it is checking (a value is read about twice: as its
step's output and as a later step's input). The reference's own run holds
its live intermediates on top of the share while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from opgraph.backends import device as dev

#: The share of the device's total memory that the reference's stored values
#: may take. Left for the rest: PyTorch's float64 converter check (19 GB on
#: ResNet-50 at batch 128), a column's own run and its autotuning. 0.4 is
#: 60.3 GB of an H200, all of ResNet-50's 58.8 GB, and 34.0 GB of an H100,
#: leaving 51 GB there (ResNet-50 then holds 24.6 GB in host memory,
#: EfficientNet-B0 0.4 GB, the other models none).
DEVICE_SHARE = 0.4


def device_budget(device: str) -> int | None:
    """Bytes of stored values the device may hold: :data:`DEVICE_SHARE` of the
    CUDA device's memory; None (no limit) on the CPU, where host and device
    memory are one.

    Raises:
        DeviceUnavailableError: ``'cuda'`` and no usable GPU.
    """
    total = dev.device_memory_bytes(device)
    return None if total is None else int(DEVICE_SHARE * total)


class ValueStore(Mapping):
    """Node id -> float64 array, each on ``device`` or, past ``budget`` bytes
    stored there, in host memory (module docstring). Reading gives an array
    on ``device`` either way: the stored one, or a fresh copy of a host
    value (so no reader may write into what it reads; none does).

    Attributes:
        device_bytes: bytes stored on the device.
        host_bytes: bytes stored in host memory.
    """

    def __init__(self, device: str, budget: int | None):
        self.device, self.budget = device, budget
        self._on_device: dict[int, object] = {}
        self._on_host: dict[int, object] = {}
        self.device_bytes = self.host_bytes = 0

    def put(self, node: int, array, *, on_device: bool = False) -> None:
        """Store ``array`` as ``node``'s value: on the device if it fits the
        budget or ``on_device`` (small values read on every column: the
        outputs), else a host copy (the device array is then the caller's to
        drop).

        Raises:
            ValueError: ``node`` is stored already (its bytes would count twice).
        """
        if node in self:
            raise ValueError(f"ValueStore.put: node {node} is stored already")
        if on_device or self.budget is None or self.device_bytes + array.nbytes <= self.budget:
            self._on_device[node] = array
            self.device_bytes += array.nbytes
        else:
            self._on_host[node] = dev.to_host(array)
            self.host_bytes += array.nbytes

    def __getitem__(self, node: int):
        if node in self._on_device:
            return self._on_device[node]
        return dev.to_device(self._on_host[node], self.device)

    def __contains__(self, node: object) -> bool:  # Mapping's default would read (copy) the value
        return node in self._on_device or node in self._on_host

    def __iter__(self) -> Iterator[int]:
        yield from self._on_device
        yield from self._on_host

    def __len__(self) -> int:
        return len(self._on_device) + len(self._on_host)

    def spill_note(self, model: str) -> str:
        """The run's note on ``model``'s reference when part of it is in host memory."""
        total = self.device_bytes + self.host_bytes
        return (f"{model}: the float64 reference keeps {total / 1e9:.1f} GB for the per-node checks; "
                f"{self.host_bytes / 1e9:.1f} GB of it past {DEVICE_SHARE:.0%} of the device's memory "
                "wait in host memory and are copied back as the checks read them")


__all__ = ["DEVICE_SHARE", "device_budget", "ValueStore"]
