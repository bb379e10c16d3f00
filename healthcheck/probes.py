"""GPU probes: one interface (``GpuProbe.read() -> NodeGpuReport``) and the probes behind it.

Why an interface: the health rules (``nuro.healthcheck.checks``) are pure functions of a report, so they are tested
with ``FakeProbe`` (in memory); the NVML adapter (``nuro.healthcheck.nvml.NvmlProbe``) is tested against a fake
``libnvidia-ml.so.1`` through the real pynvml code; only the last step, real NVML, needs a GPU machine.

The report keeps every per-GPU number the probe read (utilisation, memory, temperature, clocks, power), not only
what the checks use, so a metrics sink can be attached later without touching the probes.

Probes (``nuro.healthcheck.run.make_probe``, which sits above this module and ``nvml``: the NVML one imports
the report types from here):

=========  ==============================================================================================
``nvml``   pynvml against the driver's libnvidia-ml.so.1; every read bounded in time (see ``NvmlProbe``).
``none``   ``NoGpuProbe``: a node without GPUs; reports zero GPUs and no error.
``auto``   ``nvml``; when the library cannot be loaded the report says so with ``ProbeFailure.LIBRARY_NOT_FOUND``,
           which the checks treat as a problem only when the node is expected to have GPUs.
=========  ==============================================================================================
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Protocol

# NVML's clock event ("throttle") reason bits, from nvml.h (nvmlClocksEventReason*); copied so pure code and unit
# tests never import pynvml. Names are what operators see in drain reasons.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "GPU idle"),
    (0x002, "applications clocks setting"),
    (0x004, "SW power cap"),
    (0x008, "HW slowdown"),
    (0x010, "sync boost"),
    (0x020, "SW thermal slowdown"),
    (0x040, "HW thermal slowdown"),
    (0x080, "HW power brake slowdown"),
    (0x100, "display clock setting"),
)


def decode_throttle_reasons(mask: int) -> tuple[str, ...]:
    """Names of the bits set in an NVML clock event reason mask; unknown bits appear as ``0x...``.

    >>> decode_throttle_reasons(0x48)
    ('HW slowdown', 'HW thermal slowdown')
    """
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    if mask & ~known:
        names.append(f"0x{mask & ~known:x}")
    return tuple(names)


class ProbeFailure(StrEnum):
    """Why a probe could not read the GPUs at all (``NodeGpuReport.failure``)."""

    LIBRARY_NOT_FOUND = "library_not_found"  # no libnvidia-ml.so.1: no driver stack installed
    DRIVER_NOT_LOADED = "driver_not_loaded"  # library present, kernel module not loaded
    TIMEOUT = "timeout"  # an NVML call did not return within the probe's time limit
    NVML_ERROR = "nvml_error"  # any other NVML failure


@dataclass(frozen=True)
class GpuStatus:
    """One GPU as the probe saw it. ``None`` means "not read" (unsupported on this GPU, or the read failed).

    Attributes:
        index: NVML index (the order of ``nvidia-smi``), not CUDA_VISIBLE_DEVICES order.
        utilization_pct: GPU busy % over NVML's last sample period.
        memory_used_bytes / memory_total_bytes: framebuffer memory.
        temperature_c: core temperature, °C.
        sm_clock_mhz / mem_clock_mhz: current clocks.
        power_w: board power draw, watts.
        throttle_reasons: decoded clock event reasons now active (``decode_throttle_reasons``).
        ecc_volatile_uncorrected: uncorrectable ECC errors since the last driver load; None without ECC.
        retired_pages_pending: pages wait for retirement (a GPU reset is needed); None where unsupported
            (GPUs with row remapping, A100 and later, report that instead).
        remapped_rows_pending / remapped_rows_failure: row remapping needs a reset / ran out of spare rows.
        xid_errors: critical XID codes NVML's event API delivered since the probe started (oldest first).
        error: this GPU could not be read (e.g. "GPU is lost"); the other fields may be None.
    """

    index: int
    uuid: str = ""
    name: str = ""
    utilization_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_volatile_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    xid_errors: tuple[int, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class NodeGpuReport:
    """All GPUs of a node at one moment, or why they could not be read.

    Attributes:
        probe: which probe produced it ("nvml", "none", "fake").
        gpus: one entry per GPU the driver lists, by index.
        failure / error: set when the probe could not read the GPUs at all (then ``gpus`` is usually empty);
            ``error`` is the human text, e.g. "NVML: Driver Not Loaded".
        driver_version: the NVIDIA driver version, when known.
        taken_at: wall-clock time of the read (Unix s), for records; duration_s: how long the read took.
    """

    probe: str
    gpus: tuple[GpuStatus, ...] = ()
    failure: ProbeFailure | None = None
    error: str | None = None
    driver_version: str | None = None
    taken_at: float = 0.0
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        """JSON-able form (``nuro-healthcheck --json``, the agent's status file)."""
        out = asdict(self)
        out["failure"] = str(self.failure) if self.failure else None
        return out


class GpuProbe(Protocol):
    """Reads the node's GPUs. ``read`` must return within the probe's own time limit and never raise for a GPU
    or driver fault: faults are data (``NodeGpuReport.failure`` / ``GpuStatus.error``)."""

    name: str

    def read(self) -> NodeGpuReport: ...

    def close(self) -> None: ...


class NoGpuProbe:
    """A node without GPUs (``--probe none``): zero GPUs, no error."""

    name = "none"

    def read(self) -> NodeGpuReport:
        return NodeGpuReport(probe=self.name, taken_at=time.time())

    def close(self) -> None:
        pass


@dataclass
class FakeProbe:
    """In-memory probe for unit tests of pure code: returns the GPUs (or failure) it was given, and counts reads.

    Example::

        probe = FakeProbe.healthy(8).with_gpu(3, temperature_c=95)
    """

    gpus: Sequence[GpuStatus] = ()
    failure: ProbeFailure | None = None
    error: str | None = None
    name: str = "fake"
    reads: int = 0
    on_read: Callable[[], None] | None = field(default=None, repr=False)  # e.g. block to imitate a hung call

    @classmethod
    def healthy(cls, n_gpus: int) -> FakeProbe:
        return cls(
            gpus=[
                GpuStatus(
                    index=i,
                    uuid=f"GPU-fake-{i}",
                    name="Fake GPU",
                    utilization_pct=0,
                    memory_used_bytes=0,
                    memory_total_bytes=80 << 30,
                    temperature_c=40,
                    ecc_volatile_uncorrected=0,
                    retired_pages_pending=False,
                )
                for i in range(n_gpus)
            ]
        )

    def with_gpu(self, index: int, **changes: object) -> FakeProbe:
        """A copy with GPU ``index`` changed (``GpuStatus`` field names)."""
        gpus = [replace(g, **changes) if g.index == index else g for g in self.gpus]  # type: ignore[arg-type]
        return replace(self, gpus=gpus, reads=0)

    def read(self) -> NodeGpuReport:
        self.reads += 1
        if self.on_read is not None:
            self.on_read()
        return NodeGpuReport(
            probe=self.name, gpus=tuple(self.gpus), failure=self.failure, error=self.error, taken_at=time.time()
        )

    def close(self) -> None:
        pass
