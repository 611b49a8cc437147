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


def unavailable(device: torch.device) -> str | None:
    """Why ``read`` gives ``device`` no columns (run.json's device.telemetry), or None where it reads NVML."""
    if device.type != "cuda":
        return "not a CUDA device"
    if _nvml() is None:
        return f"no NVML: {_nvml_loaded()[1]}"
    if _handle(device) is None:
        return "NVML lists no GPU of this device's PCI bus id or UUID"
    return None


@functools.cache
def _nvml_loaded() -> tuple[Any, str]:
    """(pynvml initialised once, '') or (None, why not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    return pynvml, ""


def _nvml() -> Any:
    """pynvml, initialised; None without it or without a driver."""
    return _nvml_loaded()[0]


@functools.cache
def _handle(device: torch.device) -> Any:
    """The NVML handle of a torch device (CUDA_VISIBLE_DEVICES renumbers devices, so not by index): by its PCI bus
    id, else by its UUID among NVML's GPUs (a container may show NVML another PCI domain); None where neither
    finds it."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        props = torch.cuda.get_device_properties(device)
    except Exception:
        return None
    try:
        return nvml.nvmlDeviceGetHandleByPciBusId_v2(
            f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0")
    except Exception:
        pass
    uuid = _bare_uuid(getattr(props, "uuid", ""))
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        return next((h for h in handles if uuid and _bare_uuid(nvml.nvmlDeviceGetUUID(h)) == uuid), None)
    except Exception:
        return None


def _bare_uuid(uuid: Any) -> str:
    """A GPU UUID as torch and NVML both give it: lower case, without NVML's 'GPU-' prefix."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.lower().removeprefix("gpu-")
