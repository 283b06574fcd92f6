"""Which GPUs the ResourceClaims of a DRA pool's server pods were allocated, by NVML UUID (pure).

On a DRA pool the pod names no device: its claims do. A claim's
`status.allocation.devices.results[]` names each allocated device by (driver, pool, device),
and the ResourceSlice that publishes the device gives its attributes; NVIDIA's DRA driver
publishes the NVML UUID as `uuid` and, for a MIG device, its GPU's as `parentUUID`
(kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go). A server's report
names devices by the UUID NVML shows it, so those are the names its claims bind it to
(placement.py, swapdesk.bind).

`DraClaims` keeps, from the culler's claim and slice watches (serverpods.py), only that: each
claim's allocated devices and each device's UUIDs. Parsing is backends.dra_devices' (the same
records the capacity counts read).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..backends.dra_devices import DeviceKey, claim_record, slice_record

#: the attributes a device's NVML UUIDs are published under (NVIDIA's DRA driver)
UUID_ATTRIBUTES = ("uuid", "parentUUID")


def claim_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class DraClaims:
    """Claims' allocated devices and devices' UUIDs, as the watches last saw them."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[DeviceKey, ...]] = {}  # namespace/name -> devices
        # device -> (the slice that published it, its UUIDs); a pool republished under a new
        # generation may publish a device in two slices for a moment: the last one put wins
        self._devices: dict[DeviceKey, tuple[str, frozenset[str]]] = {}
        self._slices: dict[str, tuple[DeviceKey, ...]] = {}  # slice name -> its devices

    # -- claims
    def put_claim(self, obj: Mapping[str, Any]) -> None:
        record = claim_record(obj)
        self._claims[claim_key(obj)] = tuple(a.device for a in record.allocations)

    def drop_claim(self, obj: Mapping[str, Any]) -> None:
        self._claims.pop(claim_key(obj), None)

    def load_claims(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self._claims.clear()
        for obj in objs:
            self.put_claim(obj)

    # -- slices
    def put_slice(self, obj: Mapping[str, Any]) -> None:
        self.drop_slice(obj)
        record = slice_record(obj)
        if record is None:
            return
        name = str((obj.get("metadata") or {}).get("name", ""))
        keys = []
        for device in record.devices:
            uuids = frozenset(str(v) for v in (device.attribute(a) for a in UUID_ATTRIBUTES) if v)
            if uuids:
                self._devices[device.key] = (name, uuids)
                keys.append(device.key)
        self._slices[name] = tuple(keys)

    def drop_slice(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        for key in self._slices.pop(name, ()):
            if self._devices.get(key, ("",))[0] == name:
                del self._devices[key]

    def load_slices(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self._slices.clear()
        self._devices.clear()
        for obj in objs:
            self.put_slice(obj)

    # -- reads
    def devices(self, claims: Iterable[str]) -> tuple[frozenset[str], int] | None:
        """The UUIDs the devices allocated to `claims` (namespace/name each) are seen by, and
        how many devices they are; None while any claim is not known or not allocated, or a
        device it names is in no slice the watch has (then the caller binds by node and
        count)."""
        uuids: set[str] = set()
        devices: set[DeviceKey] = set()
        for key in claims:
            allocated = self._claims.get(key)
            if not allocated:
                return None
            for device in allocated:
                known = self._devices.get(device)
                if known is None:
                    return None
                uuids |= known[1]
                devices.add(device)
        return (frozenset(uuids), len(devices)) if devices else None
