"""Telemetry on every timed row (NVML), and compare naming the clocks beside a verdict they explain."""

import json
import random

import numpy as np
import torch
import typer
from typer.testing import CliRunner

from gdnbench import telemetry
from gdnbench.cli.compare import compare
from gdnbench.results import Row, RunDir, Status
from gdnbench.stats import summarize


def test_throttle_reasons_name_every_bit_but_idle():
    bits = random.sample(sorted(telemetry.REASONS), 3)
    names = telemetry.throttle_reasons(sum(bits) | 0x1)  # 0x1, idle, is never a reason to report
    assert names.split(", ") == [telemetry.REASONS[b] for b in sorted(bits)]
    assert telemetry.throttle_reasons(0x1) == ""


def test_no_nvml_or_a_cpu_gives_no_columns():
    assert telemetry.read(torch.device("cpu")) == {}


class FakeNVML:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, sm, power_mw, reasons):
        self.sm, self.power_mw, self.reasons = sm, power_mw, reasons

    def nvmlDeviceGetClockInfo(self, handle, which):
        return self.sm if which == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw

    def nvmlDeviceGetTemperature(self, handle, sensor):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # a query this GPU does not answer

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons


def test_read_fills_what_nvml_answers(monkeypatch):
    sm, power = random.randint(300, 2000), random.randint(50_000, 700_000)
    monkeypatch.setattr(telemetry, "_nvml", lambda: FakeNVML(sm, power, 0x4 | 0x1))
    monkeypatch.setattr(telemetry, "_handle", lambda device: "handle")
    got = telemetry.read(torch.device("cuda", 0))
    assert got == {"sm_mhz": sm, "mem_mhz": 3201, "power_w": round(power / 1000, 1), "throttle": "power cap"}


def _run(path, median, sm, throttle=""):
    rd = RunDir(path)
    rd.write_meta({"device": {"type": "cuda", "name": "GPU"}, "timing": {"timer": "graph", "l2": "cold"},
                   "status": "complete"})
    samples = (median * (1 + 0.01 * np.random.default_rng().standard_normal(60))).tolist()
    row = Row(suite="t", case_id="c", backend="b", status=Status.PASS, device="GPU", timer="graph", l2="cold",
              sm_mhz=sm, throttle=throttle, **summarize(samples).as_dict())
    rd.add_case([row], [{"case_id": "c", "backend": "b", "timer": "graph", "l2": "cold", "samples_us": samples}])
    rd.close()
    return path


def test_compare_names_the_clocks_beside_a_slowdown(tmp_path):
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("compare")(compare)
    base = _run(tmp_path / "base", 100.0, 1980)
    new = _run(tmp_path / "new", 125.0, 1590, throttle="thermal (software)")
    res = CliRunner().invoke(app, ["compare", str(base), str(new), "--json", str(tmp_path / "c.json")])
    text = " ".join(res.output.split())
    assert "c / b (SLOWER): SM clock 1980 (base) vs 1590 MHz (new); NEW timed under thermal (software)" in text
    doc = json.loads((tmp_path / "c.json").read_text())
    assert any("SM clock 1980" in w for w in doc["warnings"])
    # the same clocks on both sides and no throttling: nothing to say
    same = _run(tmp_path / "same", 125.0, 1980)
    res = CliRunner().invoke(app, ["compare", str(base), str(same)])
    assert "telemetry:" not in res.output


class FakeNVMLDevices:
    """NVML whose PCI bus ids do not match torch's (another PCI domain in a container), with GPUs by UUID."""

    def __init__(self, uuids):
        self.uuids = uuids

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id):
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"handle{i}"

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[int(handle.removeprefix("handle"))]


def test_a_gpu_nvml_lists_under_another_bus_id_is_found_by_its_uuid(monkeypatch):
    """_handle: the PCI bus id first, then the UUID (torch's without NVML's 'GPU-' prefix, any case, str or bytes);
    a GPU NVML does not list gets no handle, and run.json's device.telemetry says why."""
    import types
    import uuid

    ids = [str(uuid.uuid4()) for _ in range(3)]
    mine = random.randrange(3)
    props = types.SimpleNamespace(pci_domain_id=1, pci_bus_id=2, pci_device_id=0, uuid=ids[mine].upper())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    nvml = FakeNVMLDevices([f"GPU-{u}".encode() if i % 2 else f"GPU-{u}" for i, u in enumerate(ids)])
    monkeypatch.setattr(telemetry, "_nvml", lambda: nvml)
    device = torch.device("cuda", random.randrange(8))
    telemetry._handle.cache_clear()
    try:
        assert telemetry._handle(device) == f"handle{mine}"
        assert telemetry.unavailable(device) is None
        nvml.uuids = [u for i, u in enumerate(nvml.uuids) if i != mine]
        telemetry._handle.cache_clear()
        assert telemetry._handle(device) is None
        assert "no GPU of this device's PCI bus id or UUID" in telemetry.unavailable(device)
    finally:
        telemetry._handle.cache_clear()
    assert telemetry.unavailable(torch.device("cpu")) == "not a CUDA device"
