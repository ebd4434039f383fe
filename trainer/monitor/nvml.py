"""The NVIDIA GPU source, through NVML (``nvidia-ml-py``, the ``gpu`` extra), imported only on a
node that has NVIDIA devices.

:func:`gpu_record` is the pure conversion of NVML's units into the record's and is tested
anywhere; the NVML calls themselves (:class:`NvmlSource`) need a GPU and are checked on one.
Errors are those since the sampler started: uncorrected ECC errors (NVML's volatile counter,
which counts since the driver loaded, taken relative to its first reading) and critical XID
events (NVML's event set, drained at every sample).
"""

from __future__ import annotations

from typing import Any


def gpu_record(index: int, *, utilization_pct: int, memory_used_bytes: int, power_mw: int | None,
               temperature_c: int | None, sm_clock_mhz: int | None, new_ecc_uncorrected: int,
               xids: list[int]) -> dict[str, Any]:
    """One sample of GPU ``index`` from NVML's values: bytes to GiB, milliwatts to watts."""
    errors = new_ecc_uncorrected + len(xids)
    detail = [f"XID {x}" for x in xids] + ([f"{new_ecc_uncorrected} uncorrected ECC"] if new_ecc_uncorrected else [])
    record = {"device": f"gpu{index}", "util_pct": float(utilization_pct), "memory_gib": memory_used_bytes / 2**30,
              "power_w": None if power_mw is None else power_mw / 1000, "temperature_c": temperature_c,
              "sm_clock_mhz": sm_clock_mhz, "errors": errors}
    if detail:
        record["error_detail"] = ", ".join(detail)
    return record


class NvmlSource:
    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.index = {self._key(h): i for i, h in enumerate(self.handles)}
        self.ecc_start = [self._ecc(h) for h in self.handles]
        self.events = pynvml.nvmlEventSetCreate()
        for handle in self.handles:
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self.events)
            except pynvml.NVMLError_NotSupported:
                pass  # XID events need a data-center GPU (or a newer driver); ECC still counts

    def _key(self, handle: Any) -> str:
        return self.nvml.nvmlDeviceGetUUID(handle)

    def _optional(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported:
            return None

    def _ecc(self, handle: Any) -> int:
        n = self.nvml
        count = self._optional(n.nvmlDeviceGetTotalEccErrors, handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                               n.NVML_VOLATILE_ECC)
        return count or 0

    def _xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        while True:
            try:
                event = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError_Timeout:
                return found
            found.setdefault(self.index[self._key(event.device)], []).append(int(event.eventData))

    def sample(self, interval_s: float) -> list[dict]:
        n = self.nvml
        xids = self._xids()
        records = []
        for i, handle in enumerate(self.handles):
            records.append(gpu_record(
                i, utilization_pct=n.nvmlDeviceGetUtilizationRates(handle).gpu,
                memory_used_bytes=n.nvmlDeviceGetMemoryInfo(handle).used,
                power_mw=self._optional(n.nvmlDeviceGetPowerUsage, handle),
                temperature_c=self._optional(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU),
                sm_clock_mhz=self._optional(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_SM),
                new_ecc_uncorrected=self._ecc(handle) - self.ecc_start[i], xids=xids.get(i, [])))
        return records

    def close(self) -> None:
        self.nvml.nvmlEventSetFree(self.events)
        self.nvml.nvmlShutdown()
