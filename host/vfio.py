# Ref: Linux Documentation/driver-api/vfio.rst (container/group API, device cdev + iommufd);
#      include/uapi/linux/vfio.h, include/uapi/linux/iommufd.h (ioctl numbers, structs);
#      PCI Local Bus 3.0 6.2.2 (Command register: Memory Space, Bus Master)
"""The VFIO backend: a real Stellar NIC on PCIe, driven from user space through the kernel's
VFIO interface, with the same async :class:`~stellar.host.device.Device` API the simulated
device offers::

    async with VfioDevice("0000:03:00.0") as dev:            # or SyncDevice(VfioDevice(...))
        print(hex(await dev.read32(0)))                        # ident.id = 0x53544C52
        buf = dev.alloc_dma(1 << 20)                           # pinned, IOMMU-mapped
        mr = dev.map_dma(numpy_array)                          # zero-copy
        await dev.wait_irq(0, timeout=1.0)                     # MSI vector 0

Opening
-------
The device is named by its PCI address (``0000:03:00.0``; ``03:00.0`` means domain 0). Sysfs
gives its driver, its IOMMU group and, on kernels with the VFIO device cdev, its
``/dev/vfio/devices/vfioN``. Before any ioctl the backend checks what it can and raises a typed
error that says the fix: the device does not exist (:class:`DeviceNotFound`), is not bound to
vfio-pci (:class:`DeviceNotBound`, with the ``driver_override`` commands), its IOMMU group holds
a device still bound to a host driver (:class:`IommuGroupNotViable`, naming it), a device node
cannot be opened (:class:`DevicePermissionError`, with the ``chown``), the kernel has no IOMMU
or no vfio (:class:`VfioUnavailable`).

Two kernel paths, chosen at open time (``mode=``):

``"iommufd"``
    ``/dev/iommu`` + ``/dev/vfio/devices/vfioN`` (Linux 6.6+ with CONFIG_VFIO_DEVICE_CDEV):
    ``VFIO_DEVICE_BIND_IOMMUFD``, ``IOMMU_IOAS_ALLOC``, ``VFIO_DEVICE_ATTACH_IOMMUFD_PT``; DMA
    with ``IOMMU_IOAS_MAP`` / ``IOMMU_IOAS_UNMAP`` at IOVAs this backend chooses
    (``IOMMU_IOAS_MAP_FIXED_IOVA``) inside ``IOMMU_IOAS_IOVA_RANGES``.
``"group"``
    the container/group API every VFIO kernel has: ``/dev/vfio/vfio`` (``VFIO_GET_API_VERSION``,
    ``VFIO_CHECK_EXTENSION`` type1v2, ``VFIO_SET_IOMMU``), ``/dev/vfio/<group>``
    (``VFIO_GROUP_GET_STATUS`` viable, ``VFIO_GROUP_SET_CONTAINER``,
    ``VFIO_GROUP_GET_DEVICE_FD``); DMA with ``VFIO_IOMMU_MAP_DMA`` / ``VFIO_IOMMU_UNMAP_DMA``
    inside the IOVA ranges of ``VFIO_IOMMU_GET_INFO``.
``"auto"`` (default)
    iommufd when ``/dev/iommu`` and the device's cdev both exist, else group; if iommufd is
    refused for permissions (``/dev/iommu`` is often root-only while ``/dev/vfio/<group>`` was
    handed to the user) and the group node is accessible, the group path. ``.mode`` tells which.

Then, on both paths: ``VFIO_DEVICE_GET_INFO``; ``VFIO_DEVICE_GET_REGION_INFO`` for BAR0 (mapped
with ``mmap`` at the region's offset in the device fd; a BAR the kernel will not let us mmap is
accessed with ``pread``/``pwrite`` of 4 bytes, still one 32-bit access each) and for config
space (the Command register gets Memory Space and Bus Master set: vfio-pci does not enable bus
mastering, and without it the NIC's DMA would be dropped); ``VFIO_DEVICE_GET_IRQ_INFO`` for
MSI-X and MSI, and ``VFIO_DEVICE_SET_IRQS`` binding one eventfd per vector
(``VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER``). ``reset=True`` issues
``VFIO_DEVICE_RESET`` first.

Register access
---------------
``read32``/``write32`` index a ``memoryview`` of the BAR mapping cast to ``'I'``: each is one
aligned 32-bit load or store (CPython copies an ``'I'`` item with a fixed 4-byte ``memcpy``,
which compiles to one move), never four byte accesses that a register would see as four.

DMA memory
----------
``alloc_dma`` allocates pinned-for-DMA memory with :class:`PinnedMemory`: huge pages when the
request is at least one huge page (2 MiB on x86) and the system has some -- anonymous
``MAP_HUGETLB`` first, then a file on the hugetlbfs mount ``/dev/hugepages`` -- otherwise normal
4 KiB pages (``MAP_POPULATE``, ``MADV_DONTFORK`` so a ``fork()`` cannot move them under the
device). ``hugepages=True`` makes huge pages a requirement, ``False`` never tries them. The
IOMMU map ioctl pins the pages (and counts them against ``RLIMIT_MEMLOCK``: an ``ENOMEM``
there becomes :class:`DmaMappingError` saying to raise ``ulimit -l``).

``map_dma(obj)`` maps a program's own buffer zero-copy. The IOMMU maps whole pages, so the
pages around the buffer become reachable too (as with ``ibv_reg_mr``); ``bus_addr`` points at
the buffer's first byte inside that mapping.

Interrupts
----------
Each vector is an eventfd the kernel signals on MSI; ``wait_irq`` waits for it with an asyncio
reader on the running loop (no thread, no polling) and returns the eventfd counter: the
interrupts since the previous wait.

Not supported: vfio's no-IOMMU mode (DMA would need physical addresses; enable the IOMMU
instead), and i386 / other 32-bit hosts (the structure layouts here are those of 64-bit
Linux; ``tests/host/test_vfio_abi.py`` compares them with the system's headers).
"""

import asyncio
import ctypes
import errno as errno_
import fcntl
import mmap
import os
import re
import struct
import sys
import tempfile
from dataclasses import dataclass, field

from .device import PAGE_SIZE, Device, DmaBuffer, IovaAllocator, dma_view
from .errors import (
    DeviceClosed,
    DeviceError,
    DeviceNotBound,
    DeviceNotFound,
    DevicePermissionError,
    DmaMappingError,
    IommuGroupNotViable,
    IrqTimeout,
    IrqUnavailable,
    VfioIoctlError,
    VfioUnavailable,
)

__all__ = ["VfioDevice", "PinnedMemory", "MmioRegion", "PreadRegion", "EventfdIrq",
           "PciDeviceInfo", "VfioLocation", "normalize_pci_address", "pci_device_info",
           "locate", "parse_iova_ranges", "IOCTLS", "CONSTANTS", "STRUCTS"]


# --- ioctl numbers (asm-generic/ioctl.h: x86, arm64, riscv) --------------------------------

_IOC_NRSHIFT, _IOC_TYPESHIFT, _IOC_SIZESHIFT, _IOC_DIRSHIFT = 0, 8, 16, 30


def _IOC(direction, type_, nr, size):
    return (direction << _IOC_DIRSHIFT) | (ord(type_) << _IOC_TYPESHIFT) \
        | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT)


def _IO(type_, nr):
    return _IOC(0, type_, nr, 0)


VFIO_TYPE = ";"
VFIO_BASE = 100
IOMMUFD_TYPE = ";"
IOMMUFD_CMD_BASE = 0x80
VFIO_API_VERSION = 0

IOCTLS = {
    # container
    "VFIO_GET_API_VERSION": _IO(VFIO_TYPE, VFIO_BASE + 0),
    "VFIO_CHECK_EXTENSION": _IO(VFIO_TYPE, VFIO_BASE + 1),
    "VFIO_SET_IOMMU": _IO(VFIO_TYPE, VFIO_BASE + 2),
    # group
    "VFIO_GROUP_GET_STATUS": _IO(VFIO_TYPE, VFIO_BASE + 3),
    "VFIO_GROUP_SET_CONTAINER": _IO(VFIO_TYPE, VFIO_BASE + 4),
    "VFIO_GROUP_UNSET_CONTAINER": _IO(VFIO_TYPE, VFIO_BASE + 5),
    "VFIO_GROUP_GET_DEVICE_FD": _IO(VFIO_TYPE, VFIO_BASE + 6),
    # device
    "VFIO_DEVICE_GET_INFO": _IO(VFIO_TYPE, VFIO_BASE + 7),
    "VFIO_DEVICE_GET_REGION_INFO": _IO(VFIO_TYPE, VFIO_BASE + 8),
    "VFIO_DEVICE_GET_IRQ_INFO": _IO(VFIO_TYPE, VFIO_BASE + 9),
    "VFIO_DEVICE_SET_IRQS": _IO(VFIO_TYPE, VFIO_BASE + 10),
    "VFIO_DEVICE_RESET": _IO(VFIO_TYPE, VFIO_BASE + 11),
    # type1 IOMMU (on the container)
    "VFIO_IOMMU_GET_INFO": _IO(VFIO_TYPE, VFIO_BASE + 12),
    "VFIO_IOMMU_MAP_DMA": _IO(VFIO_TYPE, VFIO_BASE + 13),
    "VFIO_IOMMU_UNMAP_DMA": _IO(VFIO_TYPE, VFIO_BASE + 14),
    # device cdev + iommufd (Linux 6.6)
    "VFIO_DEVICE_BIND_IOMMUFD": _IO(VFIO_TYPE, VFIO_BASE + 18),
    "VFIO_DEVICE_ATTACH_IOMMUFD_PT": _IO(VFIO_TYPE, VFIO_BASE + 19),
    "VFIO_DEVICE_DETACH_IOMMUFD_PT": _IO(VFIO_TYPE, VFIO_BASE + 20),
    # iommufd (Linux 6.2)
    "IOMMU_DESTROY": _IO(IOMMUFD_TYPE, IOMMUFD_CMD_BASE + 0),
    "IOMMU_IOAS_ALLOC": _IO(IOMMUFD_TYPE, IOMMUFD_CMD_BASE + 1),
    "IOMMU_IOAS_IOVA_RANGES": _IO(IOMMUFD_TYPE, IOMMUFD_CMD_BASE + 4),
    "IOMMU_IOAS_MAP": _IO(IOMMUFD_TYPE, IOMMUFD_CMD_BASE + 5),
    "IOMMU_IOAS_UNMAP": _IO(IOMMUFD_TYPE, IOMMUFD_CMD_BASE + 6),
}
globals().update(IOCTLS)

VFIO_TYPE1v2_IOMMU = 3
VFIO_NOIOMMU_IOMMU = 8
VFIO_GROUP_FLAGS_VIABLE = 1 << 0
VFIO_GROUP_FLAGS_CONTAINER_SET = 1 << 1
VFIO_DEVICE_FLAGS_RESET = 1 << 0
VFIO_DEVICE_FLAGS_PCI = 1 << 1
VFIO_REGION_INFO_FLAG_READ = 1 << 0
VFIO_REGION_INFO_FLAG_WRITE = 1 << 1
VFIO_REGION_INFO_FLAG_MMAP = 1 << 2
VFIO_REGION_INFO_FLAG_CAPS = 1 << 3
VFIO_IRQ_INFO_EVENTFD = 1 << 0
VFIO_IRQ_SET_DATA_NONE = 1 << 0
VFIO_IRQ_SET_DATA_BOOL = 1 << 1
VFIO_IRQ_SET_DATA_EVENTFD = 1 << 2
VFIO_IRQ_SET_ACTION_MASK = 1 << 3
VFIO_IRQ_SET_ACTION_UNMASK = 1 << 4
VFIO_IRQ_SET_ACTION_TRIGGER = 1 << 5
VFIO_PCI_BAR0_REGION_INDEX = 0
VFIO_PCI_CONFIG_REGION_INDEX = 7
VFIO_PCI_INTX_IRQ_INDEX = 0
VFIO_PCI_MSI_IRQ_INDEX = 1
VFIO_PCI_MSIX_IRQ_INDEX = 2
VFIO_IOMMU_INFO_PGSIZES = 1 << 0
VFIO_IOMMU_INFO_CAPS = 1 << 1
VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE = 1
VFIO_DMA_MAP_FLAG_READ = 1 << 0
VFIO_DMA_MAP_FLAG_WRITE = 1 << 1
IOMMU_IOAS_MAP_FIXED_IOVA = 1 << 0
IOMMU_IOAS_MAP_WRITEABLE = 1 << 1
IOMMU_IOAS_MAP_READABLE = 1 << 2

# the header's names, compared with <linux/vfio.h> / <linux/iommufd.h> by tests/host/test_vfio_abi.py
CONSTANTS = {name: globals()[name] for name in (
    "VFIO_API_VERSION", "VFIO_TYPE1v2_IOMMU", "VFIO_NOIOMMU_IOMMU", "VFIO_GROUP_FLAGS_VIABLE",
    "VFIO_GROUP_FLAGS_CONTAINER_SET", "VFIO_DEVICE_FLAGS_RESET", "VFIO_DEVICE_FLAGS_PCI",
    "VFIO_REGION_INFO_FLAG_READ", "VFIO_REGION_INFO_FLAG_WRITE", "VFIO_REGION_INFO_FLAG_MMAP",
    "VFIO_REGION_INFO_FLAG_CAPS", "VFIO_IRQ_INFO_EVENTFD", "VFIO_IRQ_SET_DATA_NONE",
    "VFIO_IRQ_SET_DATA_BOOL", "VFIO_IRQ_SET_DATA_EVENTFD", "VFIO_IRQ_SET_ACTION_MASK",
    "VFIO_IRQ_SET_ACTION_UNMASK", "VFIO_IRQ_SET_ACTION_TRIGGER", "VFIO_PCI_BAR0_REGION_INDEX",
    "VFIO_PCI_CONFIG_REGION_INDEX", "VFIO_PCI_INTX_IRQ_INDEX", "VFIO_PCI_MSI_IRQ_INDEX",
    "VFIO_PCI_MSIX_IRQ_INDEX", "VFIO_IOMMU_INFO_PGSIZES", "VFIO_IOMMU_INFO_CAPS",
    "VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE", "VFIO_DMA_MAP_FLAG_READ", "VFIO_DMA_MAP_FLAG_WRITE",
    "IOMMU_IOAS_MAP_FIXED_IOVA", "IOMMU_IOAS_MAP_WRITEABLE", "IOMMU_IOAS_MAP_READABLE",
)}

# iommufd names: the ABI test compiles these against <linux/iommufd.h>, not <linux/vfio.h>
IOMMUFD_NAMES = frozenset(n for n in (*IOCTLS, *CONSTANTS) if n.startswith("IOMMU_"))
# cdev names that are in <linux/vfio.h> only from Linux 6.6
VFIO_CDEV_NAMES = frozenset({"VFIO_DEVICE_BIND_IOMMUFD", "VFIO_DEVICE_ATTACH_IOMMUFD_PT",
                             "VFIO_DEVICE_DETACH_IOMMUFD_PT"})

PCI_COMMAND = 0x04
PCI_COMMAND_MEMORY = 1 << 1
PCI_COMMAND_MASTER = 1 << 2


# --- structures --------------------------------------------------------------------------

u32, s32, u64, u16 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint16


class _Struct(ctypes.Structure):
    #: C struct name in the kernel header
    c_name = None
    #: extensible through argsz/size: a newer header may append fields after ours
    extensible = False

    @classmethod
    def new(cls, **kw):
        s = cls(**kw)
        first = cls._fields_[0][0]
        if first in ("argsz", "size"):
            setattr(s, first, ctypes.sizeof(cls))
        return s


class vfio_group_status(_Struct):
    c_name = "vfio_group_status"
    _fields_ = [("argsz", u32), ("flags", u32)]


class vfio_device_info(_Struct):
    c_name = "vfio_device_info"
    extensible = True
    _fields_ = [("argsz", u32), ("flags", u32), ("num_regions", u32), ("num_irqs", u32),
                ("cap_offset", u32)]


class vfio_region_info(_Struct):
    c_name = "vfio_region_info"
    _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("cap_offset", u32),
                ("size", u64), ("offset", u64)]


class vfio_irq_info(_Struct):
    c_name = "vfio_irq_info"
    _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("count", u32)]


class vfio_irq_set(_Struct):
    """Header only; the ``data[]`` (here: one s32 eventfd per vector) follows it."""
    c_name = "vfio_irq_set"
    _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("start", u32), ("count", u32)]


class vfio_info_cap_header(_Struct):
    c_name = "vfio_info_cap_header"
    _fields_ = [("id", u16), ("version", u16), ("next", u32)]


class vfio_iova_range(_Struct):
    c_name = "vfio_iova_range"
    _fields_ = [("start", u64), ("end", u64)]


class vfio_iommu_type1_info_cap_iova_range(_Struct):
    """Header only; ``nr_iovas`` × :class:`vfio_iova_range` follow it."""
    c_name = "vfio_iommu_type1_info_cap_iova_range"
    _fields_ = [("header", vfio_info_cap_header), ("nr_iovas", u32), ("reserved", u32)]


class vfio_iommu_type1_info(_Struct):
    c_name = "vfio_iommu_type1_info"
    extensible = True
    _fields_ = [("argsz", u32), ("flags", u32), ("iova_pgsizes", u64), ("cap_offset", u32)]


class vfio_iommu_type1_dma_map(_Struct):
    c_name = "vfio_iommu_type1_dma_map"
    _fields_ = [("argsz", u32), ("flags", u32), ("vaddr", u64), ("iova", u64), ("size", u64)]


class vfio_iommu_type1_dma_unmap(_Struct):
    c_name = "vfio_iommu_type1_dma_unmap"
    _fields_ = [("argsz", u32), ("flags", u32), ("iova", u64), ("size", u64)]


class vfio_device_bind_iommufd(_Struct):
    c_name = "vfio_device_bind_iommufd"
    extensible = True       # Linux 6.17 appends token_uuid_ptr (with a flag)
    _fields_ = [("argsz", u32), ("flags", u32), ("iommufd", s32), ("out_devid", u32)]


class vfio_device_attach_iommufd_pt(_Struct):
    c_name = "vfio_device_attach_iommufd_pt"
    extensible = True       # later kernels append pasid (with a flag)
    _fields_ = [("argsz", u32), ("flags", u32), ("pt_id", u32)]


class vfio_device_detach_iommufd_pt(_Struct):
    c_name = "vfio_device_detach_iommufd_pt"
    extensible = True
    _fields_ = [("argsz", u32), ("flags", u32)]


class iommu_destroy(_Struct):
    c_name = "iommu_destroy"
    _fields_ = [("size", u32), ("id", u32)]


class iommu_ioas_alloc(_Struct):
    c_name = "iommu_ioas_alloc"
    _fields_ = [("size", u32), ("flags", u32), ("out_ioas_id", u32)]


class iommu_iova_range(_Struct):
    c_name = "iommu_iova_range"
    _fields_ = [("start", u64), ("last", u64)]


class iommu_ioas_iova_ranges(_Struct):
    c_name = "iommu_ioas_iova_ranges"
    _fields_ = [("size", u32), ("ioas_id", u32), ("num_iovas", u32), ("__reserved", u32),
                ("allowed_iovas", u64), ("out_iova_alignment", u64)]


class iommu_ioas_map(_Struct):
    c_name = "iommu_ioas_map"
    _fields_ = [("size", u32), ("flags", u32), ("ioas_id", u32), ("__reserved", u32),
                ("user_va", u64), ("length", u64), ("iova", u64)]


class iommu_ioas_unmap(_Struct):
    c_name = "iommu_ioas_unmap"
    _fields_ = [("size", u32), ("ioas_id", u32), ("iova", u64), ("length", u64)]


STRUCTS = [vfio_group_status, vfio_device_info, vfio_region_info, vfio_irq_info, vfio_irq_set,
           vfio_info_cap_header, vfio_iova_range, vfio_iommu_type1_info_cap_iova_range,
           vfio_iommu_type1_info, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap,
           vfio_device_bind_iommufd, vfio_device_attach_iommufd_pt,
           vfio_device_detach_iommufd_pt, iommu_destroy, iommu_ioas_alloc, iommu_iova_range,
           iommu_ioas_iova_ranges, iommu_ioas_map, iommu_ioas_unmap]


# --- ioctl calls -------------------------------------------------------------------------

def _ioctl(fd, request, arg):
    """The one place that enters the kernel (tests substitute a fake kernel here). ``arg`` is an
    int (passed by value) or a writable buffer (passed by pointer, updated in place); returns
    the ioctl's return value."""
    return fcntl.ioctl(fd, request, arg, True) if not isinstance(arg, int) \
        else fcntl.ioctl(fd, request, arg)


_IOCTL_NAMES = {v: k for k, v in IOCTLS.items()}

_ERRNO_HINTS = {
    errno_.EPERM: "not permitted: run as a user that owns the VFIO device nodes (see "
                  "DevicePermissionError's fix) with a large enough `ulimit -l`",
    errno_.EACCES: "access denied to the device node",
    errno_.ENOMEM: "the IOMMU could not pin the memory: raise the locked-memory limit "
                   "(`ulimit -l unlimited`, LimitMEMLOCK=infinity for a service)",
    errno_.EBUSY: "in use: another process (or a host driver in the same IOMMU group) holds "
                  "the device; `fuser -v /dev/vfio/*` shows who",
    errno_.ENOTTY: "this kernel does not know the ioctl (too old for this path); try "
                   "mode='group'",
    errno_.EINVAL: "the kernel refused the arguments",
    errno_.EEXIST: "the IOVA range is already mapped",
    errno_.ENODEV: "the device went away (unplugged, or unbound from vfio-pci)",
}


def _call(fd, name, arg=0, *, errors=None):
    try:
        return _ioctl(fd, IOCTLS[name], arg)
    except OSError as exc:
        code = exc.errno
        cls = (errors or {}).get(code, VfioIoctlError)
        hint = _ERRNO_HINTS.get(code, "see dmesg for the kernel's reason")
        if cls is DmaMappingError:
            raise DmaMappingError(f"{name} failed: {os.strerror(code)}", ioctl=name,
                                  errno=code) from None
        raise cls(f"{name} failed: {os.strerror(code)} (errno {code})",
                  fix=hint, ioctl=name, errno=code) from None


# --- sysfs -------------------------------------------------------------------------------

_PCI_RE = re.compile(r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([01][0-9a-f])\.([0-7])$")


def normalize_pci_address(address):
    """``"3:00.0"`` is rejected, ``"03:00.0"`` -> ``"0000:03:00.0"``, case folded."""
    m = _PCI_RE.match(str(address).strip().lower())
    if not m:
        raise DeviceNotFound(f"{address!r} is not a PCI address",
                             fix="write it as DOMAIN:BUS:DEVICE.FUNCTION in hex, e.g. "
                                 "0000:03:00.0 (`lspci -D` lists them)", address=address)
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{bus}:{dev}.{fn}"


VFIO_DRIVERS = ("vfio-pci",)                            # and vendor variants ending in vfio_pci
HARMLESS_GROUP_DRIVERS = ("pci-stub", "pcieport")      # the kernel lets these share a group


def _is_vfio_driver(name):
    return name is not None and (name in VFIO_DRIVERS or name.replace("-", "_").endswith("vfio_pci"))


def _link_name(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass
class PciDeviceInfo:
    address: str
    vendor: int | None
    device: int | None
    driver: str | None
    iommu_group: int | None
    group_devices: dict = field(default_factory=dict)    # address -> driver (or None)
    vfio_cdev: str | None = None                          # "vfio0" when the kernel has cdevs
    driver_override: str | None = None


def pci_device_info(address, sysfs="/sys"):
    """What sysfs says about ``address`` (normalized); :class:`DeviceNotFound` if nothing."""
    address = normalize_pci_address(address)
    base = os.path.join(sysfs, "bus", "pci", "devices", address)
    if not os.path.isdir(base):
        raise DeviceNotFound(f"no PCI device {address} (nothing at {base})", address=address)
    vendor, device = (_read_text(os.path.join(base, n)) for n in ("vendor", "device"))
    group = _link_name(os.path.join(base, "iommu_group"))
    info = PciDeviceInfo(
        address=address, vendor=int(vendor, 16) if vendor else None,
        device=int(device, 16) if device else None,
        driver=_link_name(os.path.join(base, "driver")),
        iommu_group=int(group) if group is not None and group.isdigit() else None,
        driver_override=_read_text(os.path.join(base, "driver_override")))
    if info.driver_override in ("(null)", ""):
        info.driver_override = None
    try:
        cdevs = sorted(n for n in os.listdir(os.path.join(base, "vfio-dev")) if n.startswith("vfio"))
        info.vfio_cdev = cdevs[0] if cdevs else None
    except OSError:
        pass
    if info.iommu_group is not None:
        gdir = os.path.join(sysfs, "kernel", "iommu_groups", str(info.iommu_group), "devices")
        try:
            members = sorted(os.listdir(gdir))
        except OSError:
            members = [address]
        for member in members:
            info.group_devices[member] = _link_name(os.path.join(gdir, member, "driver"))
    return info


def _bind_commands(address, sysfs="/sys"):
    dev = f"{sysfs}/bus/pci/devices/{address}"
    return ("`sudo modprobe vfio-pci; "
            f"echo vfio-pci | sudo tee {dev}/driver_override; "
            f"echo {address} | sudo tee {dev}/driver/unbind; "
            f"echo {address} | sudo tee {sysfs}/bus/pci/drivers_probe`")


@dataclass
class VfioLocation:
    """Where the device's VFIO nodes are: the result of :func:`locate`."""
    info: PciDeviceInfo
    group_path: str            # /dev/vfio/<group>
    container_path: str        # /dev/vfio/vfio
    cdev_path: str | None      # /dev/vfio/devices/vfioN if present
    iommufd_path: str | None   # /dev/iommu if present

    @property
    def address(self):
        return self.info.address


def locate(address, *, sysfs="/sys", dev="/dev"):
    """Check that ``address`` can be opened with VFIO and find its nodes, or raise the typed
    error that says what to fix."""
    info = pci_device_info(address, sysfs)
    address = info.address
    if not _is_vfio_driver(info.driver):
        bound = f"bound to {info.driver}" if info.driver else "not bound to any driver"
        raise DeviceNotBound(f"PCI device {address} is {bound}, not vfio-pci",
                             fix=f"hand it to vfio-pci: {_bind_commands(address, sysfs)}",
                             address=address, driver=info.driver)
    if info.iommu_group is None:
        raise VfioUnavailable(f"PCI device {address} has no IOMMU group: the IOMMU is off",
                              fix="enable it on the kernel command line (intel_iommu=on or "
                                  "amd_iommu=on, plus iommu=pt) and in the firmware "
                                  "(VT-d / AMD-Vi), then reboot", address=address)
    group_path = os.path.join(dev, "vfio", str(info.iommu_group))
    if not os.path.exists(group_path):
        noiommu = os.path.join(dev, "vfio", f"noiommu-{info.iommu_group}")
        if os.path.exists(noiommu):
            raise VfioUnavailable(f"IOMMU group {info.iommu_group} of {address} is a vfio "
                                  "no-IOMMU group: DMA would need physical addresses, which "
                                  "this driver does not use",
                                  fix="enable the IOMMU (intel_iommu=on / amd_iommu=on) instead "
                                      "of vfio's enable_unsafe_noiommu_mode", address=address)
        raise VfioUnavailable(f"{group_path} does not exist although {address} is bound to "
                              f"{info.driver}", fix="load the VFIO modules (`sudo modprobe "
                              "vfio-pci`) and check that udev created /dev/vfio", address=address)
    offenders = {a: d for a, d in info.group_devices.items()
                 if a != address and d is not None and not _is_vfio_driver(d)
                 and d not in HARMLESS_GROUP_DRIVERS}
    if offenders:
        listed = ", ".join(f"{a} ({d})" for a, d in offenders.items())
        raise IommuGroupNotViable(
            f"IOMMU group {info.iommu_group} of {address} also holds {listed}, bound to host "
            "drivers: the group cannot be given to user space",
            fix="bind every device of the group to vfio-pci too (for each: "
                + _bind_commands("<address>", sysfs) + "), or unbind them; if they are unrelated "
                "devices, move the card to a slot behind an ACS-capable port",
            address=address, group=info.iommu_group, offenders=offenders)
    cdev_path = None
    if info.vfio_cdev:
        p = os.path.join(dev, "vfio", "devices", info.vfio_cdev)
        cdev_path = p if os.path.exists(p) else None
    iommufd = os.path.join(dev, "iommu")
    return VfioLocation(info=info, group_path=group_path,
                        container_path=os.path.join(dev, "vfio", "vfio"), cdev_path=cdev_path,
                        iommufd_path=iommufd if os.path.exists(iommufd) else None)


def _open(path, what):
    """Open a VFIO / iommufd node read-write, errors translated."""
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except PermissionError:
        raise DevicePermissionError(
            f"no permission to open {path} ({what})",
            fix=f"give it to your user: `sudo chown $USER {path}` (lasting: a udev rule such as "
                f"SUBSYSTEM==\"vfio\", OWNER=\"$USER\"), or run as root", path=path) from None
    except FileNotFoundError:
        raise VfioUnavailable(f"{path} ({what}) does not exist",
                              fix="load VFIO: `sudo modprobe vfio-pci` (and iommufd for "
                                  "/dev/iommu)", path=path) from None
    except OSError as exc:
        if exc.errno == errno_.EBUSY:
            raise DeviceError(f"{path} ({what}) is busy: another process has it open",
                              fix="stop the other program (`sudo fuser -v " + path + "` names "
                                  "it); a VFIO group or device can be opened by one process",
                              path=path) from None
        raise


# --- IOVA ranges -------------------------------------------------------------------------

def parse_iova_ranges(buf, cap_offset):
    """The ``VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`` ranges ``[(start, end), ...]`` (inclusive)
    from a ``VFIO_IOMMU_GET_INFO`` answer ``buf`` whose capability chain starts at
    ``cap_offset`` (0: none); None when the chain has no such capability."""
    hdr_size = ctypes.sizeof(vfio_info_cap_header)
    seen = set()
    offset = cap_offset
    while offset:
        if offset in seen or offset + hdr_size > len(buf):
            raise VfioIoctlError(f"VFIO_IOMMU_GET_INFO: malformed capability chain at {offset}",
                                 fix="report this kernel version: its answer does not parse")
        seen.add(offset)
        hdr = vfio_info_cap_header.from_buffer_copy(buf, offset)
        if hdr.id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE:
            cap = vfio_iommu_type1_info_cap_iova_range.from_buffer_copy(buf, offset)
            first = offset + ctypes.sizeof(vfio_iommu_type1_info_cap_iova_range)
            size = ctypes.sizeof(vfio_iova_range)
            return [(r.start, r.end) for r in
                    (vfio_iova_range.from_buffer_copy(buf, first + i * size)
                     for i in range(cap.nr_iovas))]
        offset = hdr.next
    return None


# Without the IOVA-range capability (kernels before 5.4): below the x86 MSI window 0xFEE00000
DEFAULT_IOVA_RANGES = [(0, 0xFEDF_FFFF)]


class _Type1Iommu:
    """DMA mapping through the VFIO container (type1v2 IOMMU)."""

    name = "group"

    def __init__(self, container):
        self.fd = container
        info = vfio_iommu_type1_info.new()
        _call(container, "VFIO_IOMMU_GET_INFO", info)
        self.page_size = PAGE_SIZE
        if info.flags & VFIO_IOMMU_INFO_PGSIZES and info.iova_pgsizes:
            self.page_size = max(PAGE_SIZE, info.iova_pgsizes & -info.iova_pgsizes)
        ranges = None
        if info.flags & VFIO_IOMMU_INFO_CAPS and info.argsz > ctypes.sizeof(info):
            buf = bytearray(info.argsz)
            struct.pack_into("I", buf, 0, info.argsz)
            _call(container, "VFIO_IOMMU_GET_INFO", buf)
            full = vfio_iommu_type1_info.from_buffer_copy(buf)
            ranges = parse_iova_ranges(buf, full.cap_offset)
        self.ranges = ranges or DEFAULT_IOVA_RANGES

    def map(self, vaddr, iova, size):
        m = vfio_iommu_type1_dma_map.new(flags=VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
                                         vaddr=vaddr, iova=iova, size=size)
        _call(self.fd, "VFIO_IOMMU_MAP_DMA", m,
              errors={errno_.ENOMEM: DmaMappingError, errno_.EPERM: DmaMappingError})

    def unmap(self, iova, size):
        u = vfio_iommu_type1_dma_unmap.new(iova=iova, size=size)
        _call(self.fd, "VFIO_IOMMU_UNMAP_DMA", u)

    def close(self):
        pass


class _IommufdIoas:
    """DMA mapping through an iommufd IO address space."""

    name = "iommufd"

    def __init__(self, iommufd, ioas_id):
        self.fd, self.ioas_id = iommufd, ioas_id
        q = iommu_ioas_iova_ranges.new(ioas_id=ioas_id, num_iovas=0)
        ranges = []
        try:
            _call(iommufd, "IOMMU_IOAS_IOVA_RANGES", q)
        except VfioIoctlError as exc:
            if exc.errno != errno_.EMSGSIZE:
                raise
        if q.num_iovas:
            arr = (iommu_iova_range * q.num_iovas)()
            q.allowed_iovas = ctypes.addressof(arr)
            _call(iommufd, "IOMMU_IOAS_IOVA_RANGES", q)
            ranges = [(r.start, r.last) for r in arr[:q.num_iovas]]
        self.page_size = max(PAGE_SIZE, q.out_iova_alignment or 0)
        self.ranges = ranges or DEFAULT_IOVA_RANGES

    def map(self, vaddr, iova, size):
        m = iommu_ioas_map.new(flags=IOMMU_IOAS_MAP_FIXED_IOVA | IOMMU_IOAS_MAP_READABLE
                               | IOMMU_IOAS_MAP_WRITEABLE, ioas_id=self.ioas_id, user_va=vaddr,
                               length=size, iova=iova)
        _call(self.fd, "IOMMU_IOAS_MAP", m,
              errors={errno_.ENOMEM: DmaMappingError, errno_.EPERM: DmaMappingError})

    def unmap(self, iova, size):
        u = iommu_ioas_unmap.new(ioas_id=self.ioas_id, iova=iova, length=size)
        _call(self.fd, "IOMMU_IOAS_UNMAP", u)

    def close(self):
        pass          # closing the iommufd (after the device fd) destroys the IOAS


# --- pinned memory -----------------------------------------------------------------------

MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)     # Linux generic value (not alpha/mips)


def hugepage_size(meminfo="/proc/meminfo"):
    """The default huge page size in bytes (0 when the kernel has none)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("Hugepagesize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _address_of(buffer):
    """Virtual address of a writable buffer's first byte (no export is kept)."""
    holder = (ctypes.c_char * 1).from_buffer(buffer)
    addr = ctypes.addressof(holder)
    del holder
    return addr


class PinnedMemory:
    """Page-aligned anonymous memory for DMA, from huge pages when possible.

    Parameters
    ----------
    size : int
        Bytes wanted; rounded up to the page size used.
    hugepages : "auto" | bool
        ``"auto"``: huge pages when ``size`` is at least one huge page and some are free, else
        normal pages; ``True``: huge pages or :class:`DmaMappingError`; ``False``: normal pages.
    hugetlbfs : str
        Mount point tried after ``MAP_HUGETLB`` (a file there is created and unlinked at once).

    Attributes: ``mmap``, ``address``, ``size`` (rounded), ``page_size``, ``huge``, ``source``
    (``"MAP_HUGETLB"``, ``"hugetlbfs"`` or ``"anonymous"``).
    """

    def __init__(self, size, *, hugepages="auto", hugetlbfs="/dev/hugepages", meminfo="/proc/meminfo"):
        if size <= 0:
            raise ValueError(f"cannot allocate {size} bytes of DMA memory")
        hp = hugepage_size(meminfo)
        want_huge = hugepages is True or (hugepages == "auto" and hp and size >= hp)
        self.mmap = None
        tried = []
        if want_huge and hp:
            length = -(-size // hp) * hp
            for source, attempt in (("MAP_HUGETLB", self._map_hugetlb),
                                    ("hugetlbfs", lambda n: self._map_hugetlbfs(n, hugetlbfs))):
                try:
                    self.mmap = attempt(length)
                except OSError as exc:
                    tried.append(f"{source}: {exc.strerror or exc}")
                    continue
                self.size, self.page_size, self.huge, self.source = length, hp, True, source
                break
        if self.mmap is None:
            if hugepages is True:
                raise DmaMappingError(
                    f"no huge pages for {size} bytes ({'; '.join(tried) or 'the kernel has none'})",
                    fix="reserve some (`echo 512 | sudo tee /proc/sys/vm/nr_hugepages`, or "
                        "hugepages=N on the kernel command line), or pass hugepages='auto'")
            length = -(-size // PAGE_SIZE) * PAGE_SIZE
            self.mmap = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                  | getattr(mmap, "MAP_POPULATE", 0))
            self.size, self.page_size, self.huge, self.source = length, PAGE_SIZE, False, "anonymous"
        if hasattr(mmap, "MADV_DONTFORK"):
            self.mmap.madvise(mmap.MADV_DONTFORK)
        self.address = _address_of(self.mmap)
        self.fallback_reasons = tried

    @staticmethod
    def _map_hugetlb(length):
        return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)

    @staticmethod
    def _map_hugetlbfs(length, mount):
        if not os.path.ismount(mount):
            raise OSError(errno_.ENOENT, f"{mount} is not a mounted hugetlbfs")
        fd, path = tempfile.mkstemp(prefix="stellar-dma-", dir=mount)
        try:
            os.unlink(path)
            os.ftruncate(fd, length)
            return mmap.mmap(fd, length, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)

    def view(self, size=None):
        """A writable memoryview of the first ``size`` bytes (all by default)."""
        return memoryview(self.mmap)[:self.size if size is None else size]

    def close(self):
        """Free the memory; views still held by the program keep it alive until dropped."""
        if self.mmap is not None:
            try:
                self.mmap.close()
            except BufferError:
                pass     # exported views: the mapping goes when the last view goes
            self.mmap = None


# --- BAR access --------------------------------------------------------------------------

class MmioRegion:
    """32-bit registers on a mapped BAR (any writable buffer: the BAR's ``mmap``, or a file's
    mmap in tests). Each access is one aligned 32-bit load or store; PCI registers are
    little-endian, so a big-endian host swaps."""

    def __init__(self, buffer, size=None):
        view = memoryview(buffer).cast("B")
        if size is not None:
            view = view[:size]
        self.size = len(view) & ~3
        self._bytes = view
        self._u32 = view[:self.size].cast("I")
        self._swap = sys.byteorder == "big"

    def read32(self, offset):
        value = self._u32[offset >> 2]
        return int.from_bytes(value.to_bytes(4, "little"), "big") if self._swap else value

    def write32(self, offset, value):
        if self._swap:
            value = int.from_bytes(value.to_bytes(4, "little"), "big")
        self._u32[offset >> 2] = value

    def close(self):
        self._u32.release()
        self._bytes.release()


class PreadRegion:
    """32-bit registers through ``pread``/``pwrite`` on the device fd at the region's offset:
    for a BAR vfio-pci will not let us mmap. vfio-pci turns a 4-byte aligned read or write into
    one 32-bit access."""

    def __init__(self, fd, base, size):
        self.fd, self.base, self.size = fd, base, size

    def read32(self, offset):
        data = os.pread(self.fd, 4, self.base + offset)
        if len(data) != 4:
            raise DeviceError(f"BAR read at {offset:#x} returned {len(data)} bytes",
                              fix="check that the offset lies inside the BAR")
        return int.from_bytes(data, "little")

    def write32(self, offset, value):
        n = os.pwrite(self.fd, value.to_bytes(4, "little"), self.base + offset)
        if n != 4:
            raise DeviceError(f"BAR write at {offset:#x} wrote {n} bytes",
                              fix="check that the offset lies inside the BAR")

    def close(self):
        pass


# --- interrupts --------------------------------------------------------------------------

class EventfdIrq:
    """One interrupt vector as an eventfd the kernel signals; awaited with a loop reader."""

    def __init__(self, vector, fd=None):
        self.vector = vector
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if fd is None else fd
        self._waiters = []
        self._loop = None

    def _take(self):
        try:
            return os.eventfd_read(self.fd)
        except BlockingIOError:
            return 0

    def _ready(self):
        count = self._take()
        if not count:
            return
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(count)

    async def wait(self, timeout=None):
        """Interrupts since the previous wait (>= 1); :class:`IrqTimeout` after ``timeout`` s.
        Several waiters on one vector all wake with the same count."""
        if self.fd is None:
            raise DeviceClosed(f"interrupt vector {self.vector} is closed")
        count = self._take()
        if count:
            return count
        loop = asyncio.get_running_loop()
        if self._waiters and self._loop is not loop:
            raise RuntimeError(f"interrupt vector {self.vector} is awaited on another event loop")
        fut = loop.create_future()
        if not self._waiters:
            loop.add_reader(self.fd, self._ready)
            self._loop = loop
        self._waiters.append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise IrqTimeout(f"no interrupt on vector {self.vector} within {timeout} s",
                             vector=self.vector, timeout=timeout) from None
        finally:
            self._waiters.remove(fut)
            if not self._waiters and self.fd is not None:
                loop.remove_reader(self.fd)
                self._loop = None

    def close(self):
        if self.fd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(self.fd)
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(DeviceClosed(f"interrupt vector {self.vector} closed while "
                                               "awaited"))
        os.close(self.fd)
        self.fd = None


# --- the device --------------------------------------------------------------------------

class VfioDevice(Device):
    """A Stellar NIC through VFIO; see the module docstring.

    Parameters
    ----------
    address : str
        PCI address, ``0000:03:00.0``.
    mode : "auto" | "iommufd" | "group"
    bar : int
        The BAR ``read32``/``write32`` address (0).
    irq : "auto" | "msix" | "msi" | None
        Interrupt kind bound to eventfds at open (``"auto"``: MSI-X if the device has it, else
        MSI; None: none).
    max_vectors : int
        At most this many vectors are bound.
    reset : bool
        ``VFIO_DEVICE_RESET`` at open (when the device supports it).
    hugepages : "auto" | bool
        Policy of ``alloc_dma`` (:class:`PinnedMemory`).
    sysfs, dev : str
        Roots of sysfs and /dev (tests point them at a fake tree).
    """

    def __init__(self, address, *, mode="auto", bar=0, irq="auto", max_vectors=32,
                 reset=False, hugepages="auto", sysfs="/sys", dev="/dev"):
        if mode not in ("auto", "iommufd", "group"):
            raise ValueError(f"mode {mode!r}: one of 'auto', 'iommufd', 'group'")
        self.location = loc = locate(address, sysfs=sysfs, dev=dev)
        self.address = loc.address
        self.hugepages = hugepages
        self._fds = []            # closed in reverse order
        self._buffers = set()
        self._bar = None
        self._bar_mmap = None
        self.irqs = []
        self.irq_index = None
        self.closed = False
        try:
            self.mode = self._open(loc, mode)
            self._setup(bar, irq, max_vectors, reset)
        except BaseException:
            self._close_sync()
            raise

    @classmethod
    async def open(cls, address, **kw):
        """``await VfioDevice.open(address, ...)``: the same as the constructor (the ioctls are
        synchronous and quick)."""
        return cls(address, **kw)

    # --- opening -------------------------------------------------------------------------

    def _keep(self, fd):
        self._fds.append(fd)
        return fd

    def _open(self, loc, mode):
        if mode == "iommufd" or (mode == "auto" and loc.cdev_path and loc.iommufd_path):
            if not (loc.cdev_path and loc.iommufd_path):
                missing = "/dev/iommu" if not loc.iommufd_path else "the VFIO device cdev"
                raise VfioUnavailable(f"mode='iommufd' but {missing} is missing for "
                                      f"{loc.address}", fix="use mode='group', or a kernel with "
                                      "CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV (6.6+)")
            try:
                self._open_iommufd(loc)
                return "iommufd"
            except DevicePermissionError:
                if mode == "iommufd" or not os.access(loc.group_path, os.R_OK | os.W_OK):
                    raise
                self._close_fds()
        self._open_group(loc)
        return "group"

    def _open_group(self, loc):
        container = self._keep(_open(loc.container_path, "the VFIO container"))
        version = _call(container, "VFIO_GET_API_VERSION")
        if version != VFIO_API_VERSION:
            raise VfioUnavailable(f"VFIO API version {version}, this driver speaks "
                                  f"{VFIO_API_VERSION}", fix="use a kernel with the standard VFIO API")
        if not _call(container, "VFIO_CHECK_EXTENSION", VFIO_TYPE1v2_IOMMU):
            raise VfioUnavailable("the VFIO container lacks the type1v2 IOMMU",
                                  fix="load vfio_iommu_type1 (`sudo modprobe vfio_iommu_type1`)")
        group = self._keep(_open(loc.group_path, f"IOMMU group {loc.info.iommu_group}"))
        status = vfio_group_status.new()
        _call(group, "VFIO_GROUP_GET_STATUS", status)
        if not status.flags & VFIO_GROUP_FLAGS_VIABLE:
            listed = ", ".join(f"{a} ({d or 'no driver'})" for a, d in loc.info.group_devices.items())
            raise IommuGroupNotViable(
                f"IOMMU group {loc.info.iommu_group} is not viable: some device in it is bound "
                f"to a host driver (members: {listed})",
                fix="bind every device of the group to vfio-pci, or unbind it",
                address=loc.address, group=loc.info.iommu_group)
        _call(group, "VFIO_GROUP_SET_CONTAINER", bytearray(struct.pack("i", container)))
        _call(container, "VFIO_SET_IOMMU", VFIO_TYPE1v2_IOMMU)
        self.iommu = _Type1Iommu(container)
        name = bytearray(loc.address.encode() + b"\0")
        self.device_fd = self._keep(_call(group, "VFIO_GROUP_GET_DEVICE_FD", name))

    def _open_iommufd(self, loc):
        iommufd = self._keep(_open(loc.iommufd_path, "iommufd"))
        device = self._keep(_open(loc.cdev_path, f"the VFIO device of {loc.address}"))
        bind = vfio_device_bind_iommufd.new(iommufd=iommufd)
        _call(device, "VFIO_DEVICE_BIND_IOMMUFD", bind)
        alloc = iommu_ioas_alloc.new()
        _call(iommufd, "IOMMU_IOAS_ALLOC", alloc)
        attach = vfio_device_attach_iommufd_pt.new(pt_id=alloc.out_ioas_id)
        _call(device, "VFIO_DEVICE_ATTACH_IOMMUFD_PT", attach)
        self.dev_id = bind.out_devid
        self.iommu = _IommufdIoas(iommufd, alloc.out_ioas_id)
        self.device_fd = device

    def _setup(self, bar, irq, max_vectors, reset):
        info = vfio_device_info.new()
        _call(self.device_fd, "VFIO_DEVICE_GET_INFO", info)
        self.device_flags = info.flags
        if not info.flags & VFIO_DEVICE_FLAGS_PCI:
            raise DeviceError(f"{self.address} is not a vfio-pci device (flags {info.flags:#x})")
        if reset:
            self.reset()
        self.bar_index = bar
        region = self.region_info(bar)
        if not region.size:
            raise DeviceError(f"BAR{bar} of {self.address} is not implemented (size 0)",
                              fix="check that the bitstream is a Stellar PCIe build (`lspci -vv "
                                  f"-s {self.address}` lists its BARs)")
        self.bar_size = region.size
        if region.flags & VFIO_REGION_INFO_FLAG_MMAP:
            self._bar_mmap = mmap.mmap(self.device_fd, region.size, flags=mmap.MAP_SHARED,
                                       prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=region.offset)
            self._bar = MmioRegion(self._bar_mmap, region.size)
        else:
            self._bar = PreadRegion(self.device_fd, region.offset, region.size)
        self.config = self.region_info(VFIO_PCI_CONFIG_REGION_INDEX)
        command = self.config_read(PCI_COMMAND, 2)
        want = command | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER
        if want != command:
            self.config_write(PCI_COMMAND, want, 2)
        self.dma = IovaAllocator(self.iommu.ranges)
        if irq is not None:
            self._setup_irqs(irq, max_vectors)

    def region_info(self, index):
        r = vfio_region_info.new(index=index)
        _call(self.device_fd, "VFIO_DEVICE_GET_REGION_INFO", r)
        return r

    def irq_info(self, index):
        i = vfio_irq_info.new(index=index)
        _call(self.device_fd, "VFIO_DEVICE_GET_IRQ_INFO", i)
        return i

    def config_read(self, offset, size=4):
        data = os.pread(self.device_fd, size, self.config.offset + offset)
        return int.from_bytes(data, "little")

    def config_write(self, offset, value, size=4):
        os.pwrite(self.device_fd, value.to_bytes(size, "little"), self.config.offset + offset)

    def _setup_irqs(self, kind, max_vectors):
        kinds = {"msix": [VFIO_PCI_MSIX_IRQ_INDEX], "msi": [VFIO_PCI_MSI_IRQ_INDEX],
                 "auto": [VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX]}
        if kind not in kinds:
            raise ValueError(f"irq {kind!r}: one of 'auto', 'msix', 'msi', None")
        for index in kinds[kind]:
            info = self.irq_info(index)
            if info.count and info.flags & VFIO_IRQ_INFO_EVENTFD:
                break
        else:
            if kind == "auto":
                return         # no MSI at all: wait_irq says so
            raise IrqUnavailable(f"{self.address} offers no {kind.upper()} vectors",
                                 fix="use irq='auto', or enable the capability in the bitstream")
        n = min(info.count, max_vectors)
        self.irqs = [EventfdIrq(v) for v in range(n)]
        hdr = vfio_irq_set.new(flags=VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                               index=index, start=0, count=n)
        hdr.argsz = ctypes.sizeof(hdr) + 4 * n
        buf = bytearray(bytes(hdr) + struct.pack(f"{n}i", *(i.fd for i in self.irqs)))
        _call(self.device_fd, "VFIO_DEVICE_SET_IRQS", buf)
        self.irq_index = index

    def reset(self):
        """``VFIO_DEVICE_RESET`` (function-level or bus reset, as the kernel can)."""
        if not self.device_flags & VFIO_DEVICE_FLAGS_RESET:
            raise DeviceError(f"{self.address} cannot be reset by VFIO (no FLR or bus reset)",
                              fix="reload the bitstream, or reset it through its registers")
        _call(self.device_fd, "VFIO_DEVICE_RESET")

    # --- the Device interface ------------------------------------------------------------

    def _live(self):
        if self.closed:
            raise DeviceClosed(f"VFIO device {self.address} is closed")

    async def read32(self, offset):
        self._live()
        return self._bar.read32(self._check_offset(offset))

    async def write32(self, offset, value):
        self._live()
        self._bar.write32(self._check_offset(offset), self._check_value(value))

    def alloc_dma(self, size, align=PAGE_SIZE):
        self._live()
        mem = PinnedMemory(size, hugepages=self.hugepages)
        try:
            iova = self.dma.alloc(mem.size, max(align, mem.page_size, self.iommu.page_size))
            try:
                self.iommu.map(mem.address, iova, mem.size)
            except BaseException:
                self.dma.free(iova)
                raise
        except BaseException:
            mem.close()
            raise
        buf = DmaBuffer(self, iova, mem.view(size), backing=(mem, iova, mem.size))
        self._buffers.add(buf)
        return buf

    def map_dma(self, obj):
        self._live()
        view = dma_view(obj)
        page = self.iommu.page_size
        addr = _address_of(view)
        start = addr & -page
        length = ((addr + view.nbytes + page - 1) & -page) - start
        iova = self.dma.alloc(length, page)
        try:
            self.iommu.map(start, iova, length)
        except BaseException:
            self.dma.free(iova)
            view.release()
            raise
        buf = DmaBuffer(self, iova + (addr - start), view, obj=obj, backing=(None, iova, length))
        self._buffers.add(buf)
        return buf

    def unmap_dma(self, buf):
        if buf not in self._buffers:
            raise ValueError(f"{buf!r} is not mapped on {self.address}")
        self._buffers.discard(buf)
        mem, iova, length = buf.backing
        try:
            if not self.closed:
                self.iommu.unmap(iova, length)
        finally:
            self.dma.free(iova)
            buf.release()
            if mem is not None:
                mem.close()

    async def wait_irq(self, vector, timeout=None):
        self._live()
        if not 0 <= vector < len(self.irqs):
            raise IrqUnavailable(
                f"interrupt vector {vector} not bound on {self.address} ({len(self.irqs)} bound)",
                fix="use a vector below the count the device offers (MSI-X / MSI capability), "
                    "or open with a larger max_vectors", vector=vector)
        return await self.irqs[vector].wait(timeout)

    async def close(self):
        self._close_sync()

    # --- teardown ------------------------------------------------------------------------

    def _close_sync(self):
        if self.closed:
            return
        if self.irqs and self.irq_index is not None:
            off = vfio_irq_set.new(flags=VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                                   index=self.irq_index, start=0, count=0)
            try:
                _call(self.device_fd, "VFIO_DEVICE_SET_IRQS", off)
            except VfioIoctlError:
                pass
        for irq in self.irqs:
            irq.close()
        for buf in list(self._buffers):
            try:
                self.unmap_dma(buf)
            except VfioIoctlError:
                pass
        if self._bar is not None:
            self._bar.close()
        if self._bar_mmap is not None:
            self._bar_mmap.close()
        iommu = getattr(self, "iommu", None)
        if iommu is not None:
            iommu.close()
        self.closed = True
        self._close_fds()

    def _close_fds(self):
        while self._fds:
            try:
                os.close(self._fds.pop())
            except OSError:
                pass

    def __repr__(self):
        state = "closed" if self.closed else f"{self.mode}, BAR{self.bar_index} {self.bar_size:#x} B, " \
            f"{len(self.irqs)} vectors"
        return f"VfioDevice({self.address}: {state})"
