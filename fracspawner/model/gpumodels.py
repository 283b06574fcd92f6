"""The built-in GPU model table: memory, SMs, GFD product label and MIG profiles.

Two memory figures per model:
- `memory_mib` is NOMINAL (the marketing GB x 1024): it names the card, matches MIG profile
  names and is what memory offers are measured against for quotas (10GiB of an 80GB card counts
  as 1/8 of a GPU);
- `nvml_memory_mib` is what NVML reports as the device's total memory (`nvidia-smi`,
  `nvmlDeviceGetMemoryInfo().total`), which is what GPU Feature Discovery labels
  (`nvidia.com/gpu.memory`) and what HAMi's device plugin registers (`devmem`, pkg/device-plugin/
  nvidiadevice/nvinternal/plugin/register.go: NVML total / MiB, times deviceMemoryScaling). A
  fraction of a GPU is a fraction of THIS figure: 4 x 1/4 of an H100 must fit in 81559 MiB, not
  in 81920. See NVML_MEMORY_MIB below for the table and its sources.

Sources (see docs/backends.md):
- MIG profiles and max instances: NVIDIA MIG user guide, "Supported MIG Profiles" tables
  (docs.nvidia.com/datacenter/tesla/mig-user-guide), cross-checked against the GPU operator's
  default-mig-parted-config and GKE's container-engine-accelerators pkg/gpu/nvidia/mig.
- SM counts per MIG profile: the same guide's tables (A100: 14 SMs per compute slice, 98 for 7g;
  H100: 16/16/26/32/60/64/132 from nvidia-smi mig -lgip).
- Product strings: what GPU Feature Discovery puts in `nvidia.com/gpu.product` (spaces -> '-').
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import SliceError


@dataclass(frozen=True)
class MigProfile:
    name: str  # canonical "1g.10gb" or "1g.10gb+me"
    compute_slices: int  # out of the model's mig_compute_slices (7, or 4 on an A30)
    memory_mib: int  # nominal: the name's GB x 1024
    max_instances: int  # per GPU
    sms: int | None = None


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int  # nominal
    sms: int | None
    mig_profiles: Mapping[str, MigProfile] = field(hash=False)
    product: str | None  # GFD `nvidia.com/gpu.product` value, used by mig-single selectors
    aliases: tuple[str, ...] = ()
    #: total memory as NVML reports it; None: not known (the nominal figure stands in)
    nvml_memory_mib: int | None = None
    #: MIG compute slices of the whole GPU: 7 on A100/H100/H200, 4 on an A30
    mig_compute_slices: int = 7

    @property
    def device_memory_mib(self) -> int:
        """The memory a device of this model really has (NVML's total), else the nominal."""
        return self.nvml_memory_mib or self.memory_mib

    def mig_profile(self, profile: str) -> MigProfile:
        try:
            return self.mig_profiles[profile]
        except KeyError:
            have = ", ".join(self.mig_profiles) or "none (this GPU has no MIG)"
            raise SliceError(
                f"{self.name} has no MIG profile {profile}; its profiles: {have}"
            ) from None


def _profiles(rows: Iterable[tuple[str, int, int, int | None]]) -> Mapping[str, MigProfile]:
    """(name, max_instances, nominal GiB, SMs) -> profiles; compute slices come from the name."""
    out = {}
    for name, max_instances, gib, sms in rows:
        out[name] = MigProfile(
            name=name,
            compute_slices=int(name.split("g.", 1)[0]),
            memory_mib=gib * 1024,
            max_instances=max_instances,
            sms=sms,
        )
    return MappingProxyType(out)


def _model(
    name: str,
    gib: int,
    sms: int | None,
    product: str | None,
    profiles: Iterable[tuple[str, int, int, int | None]] = (),
    aliases: tuple[str, ...] = (),
    compute_slices: int = 7,
) -> GpuModel:
    return GpuModel(
        name,
        gib * 1024,
        sms,
        _profiles(profiles),
        product,
        aliases,
        nvml_memory_mib=NVML_MEMORY_MIB.get(name),
        mig_compute_slices=compute_slices,
    )


#: Total memory per model as NVML reports it (MiB), the figure devices register and GFD labels.
#: Sources, each an `nvidia-smi` reading of the card:
#: - H100-80GB 81559, A100-80GB 81920, A100-40GB 40960, A10 23028, L40S 46068, L4 23034,
#:   T4 15360: modal-labs/modal-client#2797 (nvidia-smi totals across Modal's fleet); H100 also
#:   NVIDIA/nccl#1264 and wilicc/gpu-burn#114 (nvidia-smi on H100 80GB HBM3 SXM: "81559MiB");
#:   A10 also mayooot/detect-gpu#3 (NVML total 24146608128 B = 23028 MiB).
#: - H200-141GB 143771: thundergolfer.com/blog/nvidia-gpu-memory-capacity (Modal's NVML table).
#: - H100-NVL-94GB 95830 and A30-24GB 24576: nvidia-smi listings published in several public
#:   repositories ("NVIDIA H100 NVL ... /  95830MiB", "NVIDIA A30 ... /  24576MiB").
#: A value for a PCIe variant of the same name may differ (A100-PCIE-40GB reports 40536 MiB on
#: some boards): unconfirmed; such pools should describe the GPU in the catalog with its own
#: `nvml_memory_mib`, or rely on fractions being stated as a percentage where the backend can.
NVML_MEMORY_MIB: Mapping[str, int] = MappingProxyType(
    {
        "A100-40GB": 40960,
        "A100-80GB": 81920,
        "A30-24GB": 24576,
        "H100-80GB": 81559,
        "H100-NVL-94GB": 95830,
        "H200-141GB": 143771,
        "L4": 23034,
        "L40S": 46068,
        "T4": 15360,
        "A10": 23028,
    }
)


# NVIDIA MIG user guide, "A100 MIG profiles" (A100-SXM4-40GB) table: 14 SMs per compute slice.
_A100_40 = [
    ("1g.5gb", 7, 5, 14),
    ("1g.5gb+me", 1, 5, 14),
    ("1g.10gb", 4, 10, 14),
    ("2g.10gb", 3, 10, 28),
    ("3g.20gb", 2, 20, 42),
    ("4g.20gb", 1, 20, 56),
    ("7g.40gb", 1, 40, 98),
]
# NVIDIA MIG user guide, A100-SXM4-80GB table.
_A100_80 = [
    ("1g.10gb", 7, 10, 14),
    ("1g.10gb+me", 1, 10, 14),
    ("1g.20gb", 4, 20, 14),
    ("2g.20gb", 3, 20, 28),
    ("3g.40gb", 2, 40, 42),
    ("4g.40gb", 1, 40, 56),
    ("7g.80gb", 1, 80, 98),
]
# NVIDIA MIG user guide, A30-24GB table (A30 has 56 SMs, 4 compute slices).
_A30 = [
    ("1g.6gb", 4, 6, 14),
    ("1g.6gb+me", 1, 6, 14),
    ("2g.12gb", 2, 12, 28),
    ("2g.12gb+me", 1, 12, 28),
    ("4g.24gb", 1, 24, 56),
]
# NVIDIA MIG user guide, H100-SXM5-80GB table; SMs from nvidia-smi mig -lgip on an H100 SXM.
_H100_80 = [
    ("1g.10gb", 7, 10, 16),
    ("1g.10gb+me", 1, 10, 16),
    ("1g.20gb", 4, 20, 26),
    ("2g.20gb", 3, 20, 32),
    ("3g.40gb", 2, 40, 60),
    ("4g.40gb", 1, 40, 64),
    ("7g.80gb", 1, 80, 132),
]
# NVIDIA MIG user guide, H100 NVL (94GB) table.
_H100_NVL = [
    ("1g.12gb", 7, 12, 16),
    ("1g.12gb+me", 1, 12, 16),
    ("1g.24gb", 4, 24, 26),
    ("2g.24gb", 3, 24, 32),
    ("3g.47gb", 2, 47, 60),
    ("4g.47gb", 1, 47, 64),
    ("7g.94gb", 1, 94, 132),
]
# NVIDIA MIG user guide, H200 (141GB) table.
_H200 = [
    ("1g.18gb", 7, 18, 16),
    ("1g.18gb+me", 1, 18, 16),
    ("1g.35gb", 4, 35, 26),
    ("2g.35gb", 3, 35, 32),
    ("3g.71gb", 2, 71, 60),
    ("4g.71gb", 1, 71, 64),
    ("7g.141gb", 1, 141, 132),
]

_MODELS = [
    _model("A100-40GB", 40, 108, "NVIDIA-A100-SXM4-40GB", _A100_40, ("A100",)),
    _model("A100-80GB", 80, 108, "NVIDIA-A100-SXM4-80GB", _A100_80),
    # the A30 has 4 compute slices (14 SMs each), so 1g.6gb is 1/4 of it, not 1/7
    _model("A30-24GB", 24, 56, "NVIDIA-A30", _A30, ("A30",), compute_slices=4),
    _model("H100-80GB", 80, 132, "NVIDIA-H100-80GB-HBM3", _H100_80, ("H100",)),
    _model("H100-NVL-94GB", 94, 132, "NVIDIA-H100-NVL", _H100_NVL, ("H100-NVL",)),
    _model("H200-141GB", 141, 132, "NVIDIA-H200", _H200, ("H200",)),
    _model("L4", 24, 58, "NVIDIA-L4"),
    _model("L40S", 48, 142, "NVIDIA-L40S"),
    _model("T4", 16, 40, "Tesla-T4"),
    _model("A10", 24, 72, "NVIDIA-A10"),
]

#: canonical name -> model (aliases are resolved by `lookup_model`)
GPU_MODELS: Mapping[str, GpuModel] = MappingProxyType({m.name: m for m in _MODELS})
_BY_ALIAS = {a.lower(): m for m in _MODELS for a in (m.name, *m.aliases)}


def lookup_model(name: str) -> GpuModel | None:
    """A built-in model by name or alias, case-insensitively ("a30" -> A30-24GB)."""
    return _BY_ALIAS.get(name.strip().lower())
