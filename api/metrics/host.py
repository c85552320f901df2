"""Device and process gauges of the gateway's host (docs/reference/metrics.md).

Refreshed every ``--metrics-interval-ms`` by :meth:`HostSampler.refresh`, served
from the last refresh. CPU facts come from ``/proc/stat`` and ``/proc/meminfo``
(Linux only; elsewhere the CPU metrics are absent). GPU facts come from NVML
through ``pynvml`` (package ``nvidia-ml-py``), imported on first use; with no
pynvml or no GPU the GPU metrics are absent, never zero.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sluice.api.metrics.exposition import Family

__all__ = ["GpuReading", "HostSampler"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one refresh (``gpu_uuid`` is NVML's ``GPU-…`` string)."""

    uuid: str
    utilization: float  # 0.0–1.0
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_w: float | None
    power_limit_w: float | None
    energy_j: float | None  # since this sampler started


def _cpu_times(stat: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs, from the ``cpu`` line of /proc/stat."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already inside user/nice
    return total - idle, total


def _meminfo(path: Path) -> tuple[int, int] | None:
    """(total, used) bytes; used = MemTotal − MemAvailable, as Triton computes it."""
    try:
        fields = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in path.read_text().splitlines()
            if line.split(":")[0] in ("MemTotal", "MemAvailable")
        }
    except (OSError, ValueError, IndexError):
        return None
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        return None
    return fields["MemTotal"], fields["MemTotal"] - fields["MemAvailable"]


@dataclass(slots=True)
class HostSampler:
    """Keeps the latest CPU and GPU readings.

    Args:
        cpu: read CPU metrics (Triton ``--allow-cpu-metrics``).
        gpu: read GPU metrics (Triton ``--allow-gpu-metrics``).
        proc: the procfs root (tests point it elsewhere).
    """

    cpu: bool = True
    gpu: bool = True
    proc: Path = Path("/proc")
    cpu_utilization: float | None = None
    memory: tuple[int, int] | None = None
    gpus: list[GpuReading] = field(default_factory=list)
    _last_cpu: tuple[int, int] | None = None
    _nvml: ModuleType | None = None
    _nvml_failed: bool = False
    _energy_start: dict[str, float] = field(default_factory=dict)

    def refresh(self) -> None:
        """Read every enabled source now (blocking; a few ms at most)."""
        if self.cpu:
            times = _cpu_times(self.proc / "stat")
            if times is not None:
                if self._last_cpu is not None and times[1] > self._last_cpu[1]:
                    busy = times[0] - self._last_cpu[0]
                    self.cpu_utilization = min(1.0, max(0.0, busy / (times[1] - self._last_cpu[1])))
                elif self.cpu_utilization is None:
                    self.cpu_utilization = 0.0
                self._last_cpu = times
            self.memory = _meminfo(self.proc / "meminfo")
        if self.gpu:
            self.gpus = self._read_gpus()

    def _load_nvml(self) -> ModuleType | None:
        if self._nvml is not None or self._nvml_failed:
            return self._nvml
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no device
            logger.info("GPU metrics unavailable: %s", exc)
            self._nvml_failed = True
            return None
        self._nvml = pynvml
        return pynvml

    def _read_gpus(self) -> list[GpuReading]:
        nvml = self._load_nvml()
        if nvml is None:
            return []
        readings: list[GpuReading] = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            logger.warning("NVML device count failed: %s", exc)
            return []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                logger.warning("NVML read of GPU %d failed: %s", index, exc)
                continue
            power = _optional(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
            limit = _optional(lambda h=handle: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            energy_mj = _optional(lambda h=handle: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            energy = None
            if energy_mj is not None:
                start = self._energy_start.setdefault(uuid, energy_mj)
                energy = (energy_mj - start) / 1000.0
            readings.append(
                GpuReading(uuid, util, int(memory.total), int(memory.used), power, limit, energy)
            )
        return readings

    def families(self) -> list[Family]:
        """The ``nv_gpu_*`` / ``nv_energy_consumption`` / ``nv_cpu_*`` families of the
        last refresh; a source that gave nothing has no family at all."""
        out: list[Family] = []
        if self.gpus:
            specs: list[tuple[str, str, str, Any]] = [
                (
                    "nv_gpu_utilization",
                    "gauge",
                    "GPU utilization rate [0.0 - 1.0)",
                    lambda g: g.utilization,
                ),
                (
                    "nv_gpu_memory_total_bytes",
                    "gauge",
                    "GPU total memory, in bytes",
                    lambda g: g.memory_total_bytes,
                ),
                (
                    "nv_gpu_memory_used_bytes",
                    "gauge",
                    "GPU used memory, in bytes",
                    lambda g: g.memory_used_bytes,
                ),
                (
                    "nv_gpu_power_usage",
                    "gauge",
                    "GPU power usage in watts",
                    lambda g: g.power_usage_w,
                ),
                (
                    "nv_gpu_power_limit",
                    "gauge",
                    "GPU power management limit in watts",
                    lambda g: g.power_limit_w,
                ),
                (
                    "nv_energy_consumption",
                    "counter",
                    "GPU energy consumption in joules since the server started",
                    lambda g: g.energy_j,
                ),
            ]
            for name, kind, help_text, value_of in specs:
                family = Family(name, kind, help_text)
                for gpu in self.gpus:
                    value = value_of(gpu)
                    if value is not None:
                        family.add({"gpu_uuid": gpu.uuid}, value)
                if family.samples:
                    out.append(family)
        if self.cpu and self.cpu_utilization is not None:
            out.append(
                Family(
                    "nv_cpu_utilization",
                    "gauge",
                    "CPU utilization rate [0.0 - 1.0]",
                    [({}, self.cpu_utilization)],
                )
            )
        if self.cpu and self.memory is not None:
            total, used = self.memory
            out.append(
                Family(
                    "nv_cpu_memory_total_bytes",
                    "gauge",
                    "CPU total memory (RAM), in bytes",
                    [({}, total)],
                )
            )
            out.append(
                Family(
                    "nv_cpu_memory_used_bytes",
                    "gauge",
                    "CPU used memory (RAM), in bytes",
                    [({}, used)],
                )
            )
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional(read: Any) -> float | None:
    try:
        return float(read())
    except Exception:
        return None
