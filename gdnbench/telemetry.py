"""GPU telemetry on every timed row: SM and memory clocks, power, temperature and throttle reasons (NVML).

Read right after a row's samples, while the GPU is still in the state the samples saw, so that a row timed
while the GPU throttled says so (``compare`` then names the clocks beside a slowdown). NVML comes from the
``nvidia-ml-py`` package (module ``pynvml``); without it, or on a CPU, the columns stay empty.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

COLUMNS = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle")

# NVML's clock-event (throttle) reason bits; GpuIdle is left out: a GPU between samples is idle by design
REASONS = {
    0x2: "applications clocks", 0x4: "power cap", 0x8: "hardware slowdown", 0x10: "sync boost",
    0x20: "thermal (software)", 0x40: "thermal (hardware)", 0x80: "power brake", 0x100: "display clocks",
}


def read(device: torch.device) -> dict[str, Any]:
    """The telemetry columns for ``device`` now; {} where NVML cannot tell (no pynvml, a CPU, an error)."""
    handle = _handle(device) if device.type == "cuda" else None
    if handle is None:
        return {}
    nvml = _nvml()
    out: dict[str, Any] = {}
    for column, query in (
        ("sm_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        ("mem_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        ("power_w", lambda: round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1)),
        ("temp_c", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        ("throttle", lambda: throttle_reasons(_reason_bits(nvml, handle))),
    ):
        try:
            out[column] = query()
        except Exception:  # a query this GPU or driver does not support: that column stays empty
            continue
    return out


def throttle_reasons(bits: int) -> str:
    """The throttle reasons set in NVML's bit mask, comma-separated ('' when none)."""
    return ", ".join(name for bit, name in REASONS.items() if bits & bit)


def _reason_bits(nvml: Any, handle: Any) -> int:
    query = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(query(handle))


@functools.cache
def _nvml() -> Any:
    """pynvml, initialised once; None without it or without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


@functools.cache
def _handle(device: torch.device) -> Any:
    """The NVML handle of a torch device, found by its PCI bus id (CUDA_VISIBLE_DEVICES renumbers devices)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        props = torch.cuda.get_device_properties(device)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id)
    except Exception:
        return None
