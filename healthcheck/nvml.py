"""``NvmlProbe``: the node's GPUs through pynvml (NVIDIA's ``nvidia-ml-py``), bounded in time.

Why bounded: an NVML call on a GPU that fell off the bus can block for minutes inside the driver, and a blocked
health check or agent would look exactly like a healthy-but-silent node. Each ``read`` therefore runs in a worker
thread and waits at most ``timeout_s``; a read that does not finish is reported as ``ProbeFailure.TIMEOUT`` and,
while that call is still stuck, later reads report the same failure at once instead of piling up threads (a
thread blocked in C cannot be cancelled; it is a daemon thread so it never keeps the process alive).

NVML symbols this probe makes pynvml resolve (``_nvmlGetFunctionPointer``), which the test fake
(``tests/fixtures/fake_nvml``) implements: nvmlInitWithFlags, nvmlShutdown, nvmlSystemGetDriverVersion,
nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetIndex, nvmlDeviceGetUUID, nvmlDeviceGetName,
nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo, nvmlDeviceGetTemperature, nvmlDeviceGetClockInfo,
nvmlDeviceGetPowerUsage, nvmlDeviceGetCurrentClocksEventReasons (falls back to the pre-535 name
nvmlDeviceGetCurrentClocksThrottleReasons), nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRetiredPagesPendingStatus,
nvmlDeviceGetRemappedRows, nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2, nvmlEventSetFree,
nvmlErrorString.

XID errors come from NVML's event API: at init the probe registers ``nvmlEventTypeXidCriticalError`` for every GPU
that supports it, and each read drains the event set without waiting (timeout 0), so XIDs that happened between
reads are not lost. Only XIDs seen since this probe started are reported: ``nuro-healthcheck`` is a fresh process
each time, so it sees only XIDs raised during its own short run; the long-running ``nuro-nodeagent`` sees them all.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pynvml

from nuro.healthcheck.probes import GpuStatus, NodeGpuReport, ProbeFailure, decode_throttle_reasons

log = logging.getLogger(__name__)

MAX_XIDS_PER_GPU = 16  # keep the report (and the heartbeat) small; the newest are kept
_MAX_EVENTS_PER_READ = 256


def _failure_of(exc: pynvml.NVMLError) -> tuple[ProbeFailure, str]:
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return ProbeFailure.LIBRARY_NOT_FOUND, "NVML library not found (libnvidia-ml.so.1)"
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return ProbeFailure.DRIVER_NOT_LOADED, "NVML: driver not loaded"
    return ProbeFailure.NVML_ERROR, f"NVML: {exc}"


def _optional(fn: Any, *args: Any) -> Any:
    """Call an NVML query; None when this GPU or driver does not support it (consumer GPUs have no ECC, A100+ have
    row remapping instead of page retirement). Any other NVML error propagates: the GPU is in trouble."""
    try:
        return fn(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return None


class NvmlProbe:
    """Reads all GPUs through pynvml; see the module docstring for the time bound and XID handling.

    Args:
        timeout_s: the most one ``read`` may take, in seconds.
    """

    name = "nvml"

    def __init__(self, timeout_s: float = 5.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"NvmlProbe timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._initialised = False
        self._driver_version: str | None = None
        self._event_set: Any = None
        self._xids: dict[int, list[int]] = {}
        self._worker: threading.Thread | None = None
        self._hung_since: float | None = None
        self._lock = threading.Lock()

    # -- bounded read ------------------------------------------------------------------------------------------
    def read(self) -> NodeGpuReport:
        """One report within ``timeout_s``; never raises for NVML faults."""
        start = time.monotonic()
        if self._worker is not None and self._worker.is_alive():
            stuck = start - (self._hung_since or start)
            return self._failed(ProbeFailure.TIMEOUT, f"NVML call hung for {stuck:.0f} s", start)
        box: list[NodeGpuReport] = []
        worker = threading.Thread(target=lambda: box.append(self._read_now()), name="nvml-probe", daemon=True)
        self._worker = worker
        self._hung_since = start
        worker.start()
        worker.join(self.timeout_s)
        if not box:
            log.warning("nvml probe timed out timeout_s=%.1f: later reads fail fast until it returns", self.timeout_s)
            return self._failed(ProbeFailure.TIMEOUT, f"NVML did not answer within {self.timeout_s:g} s", start)
        self._hung_since = None
        return box[0]

    def _failed(self, failure: ProbeFailure, error: str, start: float) -> NodeGpuReport:
        return NodeGpuReport(
            probe=self.name,
            failure=failure,
            error=error,
            driver_version=self._driver_version,
            taken_at=time.time(),
            duration_s=time.monotonic() - start,
        )

    # -- the actual NVML calls (worker thread) -------------------------------------------------------------------
    def _read_now(self) -> NodeGpuReport:
        start = time.monotonic()
        with self._lock:
            try:
                if not self._initialised:
                    self._init()
                count = pynvml.nvmlDeviceGetCount()
                self._drain_events()
                gpus = tuple(self._gpu(i) for i in range(count))
            except pynvml.NVMLError as exc:
                failure, error = _failure_of(exc)
                if failure is not ProbeFailure.LIBRARY_NOT_FOUND:
                    log.debug("nvml read failed error=%s", error)
                return self._failed(failure, error, start)
        return NodeGpuReport(
            probe=self.name,
            gpus=gpus,
            driver_version=self._driver_version,
            taken_at=time.time(),
            duration_s=time.monotonic() - start,
        )

    def _init(self) -> None:
        """nvmlInit, driver version, and the XID event set. Retried on every read until it succeeds, so a driver
        that loads after the agent started is picked up."""
        pynvml.nvmlInit()
        self._initialised = True
        self._driver_version = _optional(pynvml.nvmlSystemGetDriverVersion)
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("nvml event set unavailable: XID errors will not be reported error=%s", exc)
            return
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
            except pynvml.NVMLError as exc:
                log.info("gpu%d: XID events not available error=%s", i, exc)

    def _drain_events(self) -> None:
        if self._event_set is None:
            return
        for _ in range(_MAX_EVENTS_PER_READ):
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, 0)
            except pynvml.NVMLError_Timeout:
                return
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                index = pynvml.nvmlDeviceGetIndex(data.device)
                seen = self._xids.setdefault(index, [])
                seen.append(int(data.eventData))
                del seen[:-MAX_XIDS_PER_GPU]
                log.warning("gpu%d: XID %d", index, data.eventData)

    def _gpu(self, index: int) -> GpuStatus:
        fields: dict[str, Any] = {"index": index, "xid_errors": tuple(self._xids.get(index, ()))}
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            fields["uuid"] = pynvml.nvmlDeviceGetUUID(handle)
            fields["name"] = pynvml.nvmlDeviceGetName(handle)
            util = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
            fields["utilization_pct"] = None if util is None else int(util.gpu)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            fields["memory_used_bytes"], fields["memory_total_bytes"] = int(mem.used), int(mem.total)
            fields["temperature_c"] = int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
            fields["sm_clock_mhz"] = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            fields["mem_clock_mhz"] = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
            power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
            fields["power_w"] = None if power_mw is None else power_mw / 1000.0
            try:
                mask = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except pynvml.NVMLError_FunctionNotFound:  # drivers before 535 only have the old name
                mask = _optional(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            fields["throttle_reasons"] = decode_throttle_reasons(mask or 0)
            fields["ecc_volatile_uncorrected"] = _optional(
                pynvml.nvmlDeviceGetTotalEccErrors,
                handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            pending = _optional(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            fields["retired_pages_pending"] = None if pending is None else bool(pending)
            rows = _optional(pynvml.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                _corr, _unc, row_pending, row_failure = rows
                fields["remapped_rows_pending"], fields["remapped_rows_failure"] = bool(row_pending), bool(row_failure)
        except pynvml.NVMLError as exc:
            fields["error"] = str(exc)
        return GpuStatus(**fields)

    def close(self) -> None:
        """Free the event set and shut NVML down, unless a call is still hung in it."""
        if self._worker is not None and self._worker.is_alive():
            return
        with self._lock:
            if not self._initialised:
                return
            try:
                if self._event_set is not None:
                    pynvml.nvmlEventSetFree(self._event_set)
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.debug("nvml shutdown failed error=%s", exc)
            self._initialised = False
            self._event_set = None
