"""stellar.host.vfio without a VFIO device: sysfs parsing on a fake sysfs tree and the typed
errors with their fixes, the IOVA-range capability parser, pinned DMA memory (huge pages when
the machine has them, the documented fallback otherwise), BAR access on an mmap of a file,
interrupts on real eventfds with asyncio, and the whole open / DMA / interrupt / close sequence
of both kernel paths (container/group and iommufd) against a fake kernel that checks every
ioctl's arguments the way the real one would.

The fake kernel replaces ``stellar.host.vfio._ioctl`` only: device nodes are real files under
``tmp_path`` (opened with ``os.open``), the BAR is an ``mmap`` of such a file at the region
offset the fake reports, config space is ``pread``/``pwrite`` on it, the eventfds are real, and
DMA mappings are checked against the real addresses of the pinned or mapped memory (the fake
reads the bytes at the ``vaddr`` it was given).
"""

import asyncio
import ctypes
import errno
import mmap
import os
import struct
import threading

import numpy as np
import pytest
from stellar.host import vfio
from stellar.host.device import Device, SyncDevice
from stellar.host.errors import (
    BufferNotMappable,
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
from stellar.host.vfio import (
    EventfdIrq,
    MmioRegion,
    PinnedMemory,
    PreadRegion,
    VfioDevice,
    locate,
    normalize_pci_address,
    parse_iova_ranges,
    pci_device_info,
)

ADDR = "0000:03:00.0"
GROUP = 7
BAR_SIZE = 0x10000
CONFIG_OFFSET = 0x10000          # where the fake puts the config region in the device file
MAGIC = 0x53544C52


# --- a fake sysfs / dev tree -------------------------------------------------------------

def make_tree(root, devices, *, cdev=True, iommufd=True, group_node=True):
    """``devices``: {address: (driver or None, group or None)}. Returns (sysfs, dev)."""
    sysfs, dev = root / "sys", root / "dev"
    for addr, (driver, group) in devices.items():
        d = sysfs / "bus" / "pci" / "devices" / addr
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10ee\n")
        (d / "device").write_text("0x9038\n")
        (d / "driver_override").write_text("(null)\n")
        if driver:
            drv = sysfs / "bus" / "pci" / "drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            (d / "driver").symlink_to(drv)
        if group is not None:
            g = sysfs / "kernel" / "iommu_groups" / str(group)
            (g / "devices").mkdir(parents=True, exist_ok=True)
            (g / "devices" / addr).symlink_to(d)
            (d / "iommu_group").symlink_to(g)
            if cdev and driver == "vfio-pci":
                (d / "vfio-dev" / "vfio0").mkdir(parents=True)
    (dev / "vfio" / "devices").mkdir(parents=True)
    (dev / "vfio" / "vfio").write_bytes(b"")
    if group_node:
        for _driver, group in devices.values():
            if group is not None:
                (dev / "vfio" / str(group)).write_bytes(b"")
    if cdev:
        _device_file(dev / "vfio" / "devices" / "vfio0")
    if iommufd:
        (dev / "iommu").write_bytes(b"")
    return str(sysfs), str(dev)


def _device_file(path):
    """BAR0 (with the ident register) then config space (Command register 0)."""
    data = bytearray(CONFIG_OFFSET + 256)
    struct.pack_into("<I", data, 0, MAGIC)
    struct.pack_into("<HH", data, CONFIG_OFFSET, 0x10EE, 0x9038)
    path.write_bytes(bytes(data))


# --- sysfs and errors --------------------------------------------------------------------

def test_normalize_pci_address():
    assert normalize_pci_address("03:00.0") == "0000:03:00.0"
    assert normalize_pci_address("0000:AF:1f.7") == "0000:af:1f.7"
    assert normalize_pci_address(" 10000:03:00.1 ") == "10000:03:00.1"
    for bad in ("3:00.0", "0000:03:00", "0000:03:20.0", "0000:03:00.8", "eth0"):
        with pytest.raises(DeviceNotFound, match="not a PCI address") as info:
            normalize_pci_address(bad)
        assert "0000:03:00.0" in info.value.fix


def test_pci_device_info(tmp_path):
    sysfs, _ = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP), "0000:03:00.1": (None, GROUP)})
    info = pci_device_info("03:00.0", sysfs)
    assert (info.address, info.vendor, info.device, info.driver) == (ADDR, 0x10EE, 0x9038, "vfio-pci")
    assert info.iommu_group == GROUP and info.vfio_cdev == "vfio0"
    assert info.group_devices == {ADDR: "vfio-pci", "0000:03:00.1": None}
    assert info.driver_override is None


def test_locate_finds_the_nodes(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP), "0000:00:01.0": ("pcieport", GROUP)})
    loc = locate(ADDR, sysfs=sysfs, dev=dev)
    assert loc.group_path == os.path.join(dev, "vfio", str(GROUP))
    assert loc.container_path == os.path.join(dev, "vfio", "vfio")
    assert loc.cdev_path == os.path.join(dev, "vfio", "devices", "vfio0")
    assert loc.iommufd_path == os.path.join(dev, "iommu")


def test_locate_device_not_found(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)})
    with pytest.raises(DeviceNotFound, match="no PCI device 0000:04:00.0") as info:
        locate("04:00.0", sysfs=sysfs, dev=dev)
    assert "lspci" in str(info.value) and info.value.code == "E5001"


def test_locate_not_bound_says_driver_override(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("mlx5_core", GROUP)})
    with pytest.raises(DeviceNotBound, match="bound to mlx5_core, not vfio-pci") as info:
        locate(ADDR, sysfs=sysfs, dev=dev)
    text = str(info.value)
    assert f"echo vfio-pci | sudo tee {sysfs}/bus/pci/devices/{ADDR}/driver_override" in text
    assert f"echo {ADDR} | sudo tee {sysfs}/bus/pci/devices/{ADDR}/driver/unbind" in text
    assert "drivers_probe" in text and "modprobe vfio-pci" in text
    assert info.value.driver == "mlx5_core"
    sysfs2, dev2 = make_tree(tmp_path / "b", {ADDR: (None, GROUP)})
    with pytest.raises(DeviceNotBound, match="not bound to any driver"):
        locate(ADDR, sysfs=sysfs2, dev=dev2)


def test_locate_vendor_vfio_variant_driver_accepted(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("mlx5_vfio_pci", GROUP)})
    assert locate(ADDR, sysfs=sysfs, dev=dev).info.driver == "mlx5_vfio_pci"


def test_locate_no_iommu(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", None)})
    with pytest.raises(VfioUnavailable, match="no IOMMU group") as info:
        locate(ADDR, sysfs=sysfs, dev=dev)
    assert "intel_iommu=on" in info.value.fix


def test_locate_noiommu_group_refused(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)}, group_node=False)
    (tmp_path / "dev" / "vfio" / f"noiommu-{GROUP}").write_bytes(b"")
    with pytest.raises(VfioUnavailable, match="no-IOMMU group"):
        locate(ADDR, sysfs=sysfs, dev=dev)
    os.unlink(tmp_path / "dev" / "vfio" / f"noiommu-{GROUP}")
    with pytest.raises(VfioUnavailable, match="modprobe vfio-pci"):
        locate(ADDR, sysfs=sysfs, dev=dev)


def test_locate_group_not_viable_names_the_other_device(tmp_path):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP), "0000:03:00.1": ("ixgbe", GROUP),
                                      "0000:03:00.2": ("pci-stub", GROUP)})
    with pytest.raises(IommuGroupNotViable, match=r"also holds 0000:03:00.1 \(ixgbe\)") as info:
        locate(ADDR, sysfs=sysfs, dev=dev)
    assert info.value.offenders == {"0000:03:00.1": "ixgbe"}
    assert "driver_override" in info.value.fix and info.value.code == "E5003"


def test_open_permission_error_says_chown(tmp_path, monkeypatch):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)}, cdev=False, iommufd=False)
    group = os.path.join(dev, "vfio", str(GROUP))
    real_open = os.open

    def deny(path, *a, **k):
        if str(path) == group:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, *a, **k)

    FakeKernel(tmp_path).install(monkeypatch)
    monkeypatch.setattr(vfio.os, "open", deny)
    with pytest.raises(DevicePermissionError, match=f"no permission to open {group}") as info:
        VfioDevice(ADDR, sysfs=sysfs, dev=dev)
    assert f"sudo chown $USER {group}" in info.value.fix
    assert isinstance(info.value, PermissionError)


# --- IOVA-range capability ---------------------------------------------------------------

def _type1_info_with_caps(ranges, *, other_cap_first=True):
    """A VFIO_IOMMU_GET_INFO answer: info, then (optionally) a DMA_AVAIL capability, then the
    IOVA-range capability."""
    base = ctypes.sizeof(vfio.vfio_iommu_type1_info)
    caps = bytearray()
    iova_off = base
    if other_cap_first:
        iova_off = base + 16
        hdr = vfio.vfio_info_cap_header(id=3, version=1, next=iova_off)
        caps += bytes(hdr) + struct.pack("II", 1000, 0)
    hdr = vfio.vfio_info_cap_header(id=vfio.VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, version=1, next=0)
    caps += bytes(hdr) + struct.pack("II", len(ranges), 0)
    for start, end in ranges:
        caps += bytes(vfio.vfio_iova_range(start=start, end=end))
    info = vfio.vfio_iommu_type1_info(argsz=base + len(caps),
                                      flags=vfio.VFIO_IOMMU_INFO_PGSIZES | vfio.VFIO_IOMMU_INFO_CAPS,
                                      iova_pgsizes=0x40201000, cap_offset=base)
    return bytearray(bytes(info) + caps)


def test_parse_iova_ranges():
    ranges = [(0, 0xFEDFFFFF), (0xFEF00000, (1 << 48) - 1)]
    buf = _type1_info_with_caps(ranges)
    assert parse_iova_ranges(buf, ctypes.sizeof(vfio.vfio_iommu_type1_info)) == ranges
    assert parse_iova_ranges(_type1_info_with_caps(ranges, other_cap_first=False), 24) == ranges
    assert parse_iova_ranges(buf, 0) is None
    loop = bytearray(buf)
    struct.pack_into("I", loop, 24 + 4, 24)      # the first cap points at itself
    with pytest.raises(VfioIoctlError, match="malformed capability chain"):
        parse_iova_ranges(loop, 24)


# --- pinned memory -----------------------------------------------------------------------

def test_pinned_memory_normal_pages():
    mem = PinnedMemory(10_000, hugepages=False)
    assert (mem.size, mem.page_size, mem.huge, mem.source) == (12288, 4096, False, "anonymous")
    assert mem.address % 4096 == 0
    v = mem.view(10_000)
    assert len(v) == 10_000 and not v.readonly and bytes(v[:16]) == bytes(16)
    v[0:4] = b"\x01\x02\x03\x04"
    assert ctypes.string_at(mem.address, 4) == b"\x01\x02\x03\x04"    # the address is the memory
    v.release()
    mem.close()
    with pytest.raises(ValueError):
        PinnedMemory(0)


def _free_hugepages():
    for line in open("/proc/meminfo"):
        if line.startswith("HugePages_Free:"):
            return int(line.split()[1])
    return 0


def test_pinned_memory_hugepages_or_documented_fallback():
    hp = vfio.hugepage_size()
    if not hp:
        pytest.skip("this kernel reports no huge page size")
    mem = PinnedMemory(hp, hugepages="auto")
    if _free_hugepages():
        assert mem.huge and mem.page_size == hp and mem.address % hp == 0
    else:
        # no huge page reserved here: normal pages, and the reasons are kept
        assert not mem.huge and mem.source == "anonymous" and mem.size == hp
        assert mem.fallback_reasons and mem.fallback_reasons[0].startswith("MAP_HUGETLB")
        with pytest.raises(DmaMappingError, match="no huge pages") as info:
            PinnedMemory(hp, hugepages=True)
        assert "nr_hugepages" in info.value.fix
    mem.close()
    small = PinnedMemory(4096, hugepages="auto")      # below one huge page: never wasted
    assert not small.huge
    small.close()


def test_pinned_memory_hugetlbfs_file_path(tmp_path, monkeypatch):
    """The hugetlbfs attempt creates, unlinks and maps a file on the mount (a plain directory
    stands in for the mount here; MAP_HUGETLB is made to fail first)."""
    monkeypatch.setattr(vfio.os.path, "ismount", lambda p: p == str(tmp_path))
    monkeypatch.setattr(PinnedMemory, "_map_hugetlb",
                        staticmethod(lambda n: (_ for _ in ()).throw(OSError(errno.ENOMEM, "none"))))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("Hugepagesize:       2048 kB\n")
    mem = PinnedMemory(3 << 20, hugepages=True, hugetlbfs=str(tmp_path), meminfo=str(meminfo))
    assert (mem.source, mem.huge, mem.size) == ("hugetlbfs", True, 4 << 20)
    assert os.listdir(tmp_path) == ["meminfo"]       # the file was unlinked at once
    mem.view()[-1] = 7
    mem.close()


# --- BAR access --------------------------------------------------------------------------

def test_mmio_region_on_an_mmapped_file(tmp_path):
    path = tmp_path / "bar0"
    path.write_bytes(bytes(range(256)) * 16)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    bar = MmioRegion(mm, 4096)
    assert bar.read32(0) == 0x03020100 and bar.read32(0xFC) == 0xFFFEFDFC
    bar.write32(0x40, 0xDEADBEEF)
    data = os.pread(fd, 12, 0x3C)          # the file sees exactly those 4 bytes, little-endian
    assert data == bytes([0x3C, 0x3D, 0x3E, 0x3F]) + b"\xEF\xBE\xAD\xDE" + bytes([0x44, 0x45, 0x46, 0x47])
    assert bar._u32.format == "I" and bar._u32.itemsize == 4    # 32-bit items, not bytes
    bar.close()
    mm.close()                              # the views are released: the mapping can go
    os.close(fd)


def test_pread_region(tmp_path):
    path = tmp_path / "dev"
    path.write_bytes(bytes(0x2000))
    fd = os.open(path, os.O_RDWR)
    bar = PreadRegion(fd, 0x1000, 0x1000)
    bar.write32(8, 0x01020304)
    assert os.pread(fd, 4, 0x1008) == b"\x04\x03\x02\x01" and bar.read32(8) == 0x01020304
    with pytest.raises(DeviceError, match="returned 0 bytes"):
        PreadRegion(fd, 0x2000, 16).read32(0)
    os.close(fd)


# --- interrupts on real eventfds ---------------------------------------------------------

def test_eventfd_irq_wait_count_timeout_and_close():
    async def main():
        irq = EventfdIrq(2)
        loop = asyncio.get_running_loop()
        # signalled from another thread, as the kernel would
        threading.Timer(0.02, os.eventfd_write, (irq.fd, 1)).start()
        assert await irq.wait(timeout=2) == 1
        os.eventfd_write(irq.fd, 1)
        os.eventfd_write(irq.fd, 1)
        assert await irq.wait(timeout=0) == 2      # already pending: the count since last wait
        with pytest.raises(IrqTimeout, match="vector 2 within 0.01 s") as info:
            await irq.wait(timeout=0.01)
        assert info.value.vector == 2
        assert irq._waiters == [] and irq._loop is None          # the reader was removed
        # two waiters wake together
        a = asyncio.ensure_future(irq.wait(timeout=2))
        b = asyncio.ensure_future(irq.wait(timeout=2))
        await asyncio.sleep(0)
        loop.call_later(0.01, os.eventfd_write, irq.fd, 3)
        assert await asyncio.gather(a, b) == [3, 3]
        # close while awaited
        c = asyncio.ensure_future(irq.wait(timeout=2))
        await asyncio.sleep(0)
        irq.close()
        with pytest.raises(DeviceClosed):
            await c
        with pytest.raises(DeviceClosed):
            await irq.wait()
    asyncio.run(main())


# --- the whole device against a fake kernel ----------------------------------------------

class FakeKernel:
    """The VFIO / iommufd ioctls of one vfio-pci device, checked like the kernel checks them."""

    def __init__(self, root, *, msix=4, msi=1, viable=True, map_errno=None,
                 type1_ranges=((0, 0xFEDFFFFF), (0xFEF00000, (1 << 39) - 1))):
        self.root = root
        self.msix, self.msi, self.viable, self.map_errno = msix, msi, viable, map_errno
        self.type1_ranges = list(type1_ranges)
        self.calls = []
        self.maps = {}                 # iova -> (vaddr, size)
        self.irq_fds = None
        self.irq_index = None
        self.container_set = False
        self.iommu_set = False
        self.device_fds = []
        self.resets = 0

    def install(self, monkeypatch):
        monkeypatch.setattr(vfio, "_ioctl", self.ioctl)
        return self

    def _path(self, fd):
        return os.readlink(f"/proc/self/fd/{fd}")

    def ioctl(self, fd, request, arg):
        name = vfio._IOCTL_NAMES.get(request)
        if name is None:
            raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")
        self.calls.append(name)
        return getattr(self, name.lower())(fd, arg)

    @staticmethod
    def _s(cls, arg):
        s = cls.from_buffer(arg)
        assert s.argsz if hasattr(s, "argsz") else s.size, f"{cls.__name__}: argsz/size not set"
        return s

    # container
    def vfio_get_api_version(self, fd, arg):
        assert self._path(fd).endswith("/vfio/vfio")
        return 0

    def vfio_check_extension(self, fd, arg):
        return int(arg == vfio.VFIO_TYPE1v2_IOMMU)

    def vfio_set_iommu(self, fd, arg):
        assert self.container_set, "VFIO_SET_IOMMU before a group joined the container"
        assert arg == vfio.VFIO_TYPE1v2_IOMMU
        self.iommu_set = True
        return 0

    def vfio_iommu_get_info(self, fd, arg):
        assert self.iommu_set
        full = _type1_info_with_caps(self.type1_ranges, other_cap_first=True)
        argsz = struct.unpack_from("I", arg)[0]
        n = min(argsz, len(full))
        memoryview(arg).cast("B")[:n] = full[:n]
        if argsz < len(full):
            struct.pack_into("I", arg, 20, 0)          # cap_offset 0 when it did not fit
        return 0

    def vfio_iommu_map_dma(self, fd, arg):
        m = self._s(vfio.vfio_iommu_type1_dma_map, arg)
        return self._map(m.vaddr, m.iova, m.size, m.flags == 3, self.type1_ranges)

    def vfio_iommu_unmap_dma(self, fd, arg):
        u = self._s(vfio.vfio_iommu_type1_dma_unmap, arg)
        return self._unmap(u.iova, u.size)

    def _map(self, vaddr, iova, size, rw, ranges):
        if self.map_errno:
            raise OSError(self.map_errno, os.strerror(self.map_errno))
        assert rw, "mapped without read and write"
        assert vaddr % 4096 == 0 and iova % 4096 == 0 and size % 4096 == 0 and size
        assert any(s <= iova and iova + size - 1 <= e for s, e in ranges), hex(iova)
        for other, (_, osize) in self.maps.items():
            if iova < other + osize and other < iova + size:
                raise OSError(errno.EEXIST, "File exists")
        self.maps[iova] = (vaddr, size)
        return 0

    def _unmap(self, iova, size):
        assert self.maps.pop(iova)[1] == size
        return 0

    def read_dma(self, bus_addr, n):
        """What the device would read at ``bus_addr``: through the recorded mapping."""
        for iova, (vaddr, size) in self.maps.items():
            if iova <= bus_addr and bus_addr + n <= iova + size:
                return ctypes.string_at(vaddr + bus_addr - iova, n)
        raise AssertionError(f"bus address {bus_addr:#x} not mapped")

    # group
    def vfio_group_get_status(self, fd, arg):
        s = self._s(vfio.vfio_group_status, arg)
        s.flags = vfio.VFIO_GROUP_FLAGS_VIABLE if self.viable else 0
        return 0

    def vfio_group_set_container(self, fd, arg):
        container = struct.unpack("i", bytes(arg))[0]
        assert self._path(container).endswith("/vfio/vfio")
        self.container_set = True
        return 0

    def vfio_group_get_device_fd(self, fd, arg):
        assert bytes(arg) == ADDR.encode() + b"\0"
        assert self.iommu_set, "device fd requested before the IOMMU was set"
        path = self.root / "group-device"
        _device_file(path)
        dfd = os.open(path, os.O_RDWR)
        self.device_fds.append(dfd)
        return dfd

    # device
    def vfio_device_get_info(self, fd, arg):
        s = self._s(vfio.vfio_device_info, arg)
        s.flags = vfio.VFIO_DEVICE_FLAGS_PCI | vfio.VFIO_DEVICE_FLAGS_RESET
        s.num_regions, s.num_irqs = 9, 5
        return 0

    def vfio_device_get_region_info(self, fd, arg):
        r = self._s(vfio.vfio_region_info, arg)
        rw = vfio.VFIO_REGION_INFO_FLAG_READ | vfio.VFIO_REGION_INFO_FLAG_WRITE
        if r.index == 0:
            r.flags, r.size, r.offset = rw | vfio.VFIO_REGION_INFO_FLAG_MMAP, BAR_SIZE, 0
        elif r.index == vfio.VFIO_PCI_CONFIG_REGION_INDEX:
            r.flags, r.size, r.offset = rw, 256, CONFIG_OFFSET
        else:
            r.flags, r.size, r.offset = 0, 0, 0
        return 0

    def vfio_device_get_irq_info(self, fd, arg):
        i = self._s(vfio.vfio_irq_info, arg)
        counts = {vfio.VFIO_PCI_MSI_IRQ_INDEX: self.msi, vfio.VFIO_PCI_MSIX_IRQ_INDEX: self.msix}
        i.count = counts.get(i.index, 0)
        i.flags = vfio.VFIO_IRQ_INFO_EVENTFD if i.count else 0
        return 0

    def vfio_device_set_irqs(self, fd, arg):
        hdr = vfio.vfio_irq_set.from_buffer(arg)
        hs = ctypes.sizeof(hdr)
        if hdr.flags & vfio.VFIO_IRQ_SET_DATA_NONE:
            assert hdr.count == 0 and hdr.index == self.irq_index
            self.irq_fds = None
            return 0
        assert hdr.flags == vfio.VFIO_IRQ_SET_DATA_EVENTFD | vfio.VFIO_IRQ_SET_ACTION_TRIGGER
        assert hdr.argsz == hs + 4 * hdr.count and hdr.start == 0
        self.irq_fds = list(struct.unpack_from(f"{hdr.count}i", arg, hs))
        self.irq_index = hdr.index
        return 0

    def vfio_device_reset(self, fd, arg):
        self.resets += 1
        return 0

    # iommufd
    def vfio_device_bind_iommufd(self, fd, arg):
        b = self._s(vfio.vfio_device_bind_iommufd, arg)
        assert self._path(b.iommufd).endswith("/iommu")
        assert self._path(fd).endswith("/vfio/devices/vfio0")
        b.out_devid = 5
        return 0

    def iommu_ioas_alloc(self, fd, arg):
        a = self._s(vfio.iommu_ioas_alloc, arg)
        a.out_ioas_id = 9
        return 0

    def vfio_device_attach_iommufd_pt(self, fd, arg):
        assert self._s(vfio.vfio_device_attach_iommufd_pt, arg).pt_id == 9
        return 0

    IOAS_RANGES = [(0, 0xFEDFFFFF), (0xFEF00000, (1 << 48) - 1)]

    def iommu_ioas_iova_ranges(self, fd, arg):
        q = self._s(vfio.iommu_ioas_iova_ranges, arg)
        assert q.ioas_id == 9
        if q.num_iovas < len(self.IOAS_RANGES):
            q.num_iovas = len(self.IOAS_RANGES)
            raise OSError(errno.EMSGSIZE, "Message too long")
        arr = (vfio.iommu_iova_range * q.num_iovas).from_address(q.allowed_iovas)
        for i, (s, e) in enumerate(self.IOAS_RANGES):
            arr[i].start, arr[i].last = s, e
        q.num_iovas, q.out_iova_alignment = len(self.IOAS_RANGES), 4096
        return 0

    def iommu_ioas_map(self, fd, arg):
        m = self._s(vfio.iommu_ioas_map, arg)
        assert m.ioas_id == 9 and m.flags & vfio.IOMMU_IOAS_MAP_FIXED_IOVA
        rw = vfio.IOMMU_IOAS_MAP_READABLE | vfio.IOMMU_IOAS_MAP_WRITEABLE
        return self._map(m.user_va, m.iova, m.length, m.flags & rw == rw, self.IOAS_RANGES)

    def iommu_ioas_unmap(self, fd, arg):
        u = self._s(vfio.iommu_ioas_unmap, arg)
        return self._unmap(u.iova, u.length)


GROUP_SEQUENCE = ["VFIO_GET_API_VERSION", "VFIO_CHECK_EXTENSION", "VFIO_GROUP_GET_STATUS",
                  "VFIO_GROUP_SET_CONTAINER", "VFIO_SET_IOMMU", "VFIO_IOMMU_GET_INFO",
                  "VFIO_IOMMU_GET_INFO", "VFIO_GROUP_GET_DEVICE_FD", "VFIO_DEVICE_GET_INFO",
                  "VFIO_DEVICE_GET_REGION_INFO", "VFIO_DEVICE_GET_REGION_INFO",
                  "VFIO_DEVICE_GET_IRQ_INFO", "VFIO_DEVICE_SET_IRQS"]
IOMMUFD_SEQUENCE = ["VFIO_DEVICE_BIND_IOMMUFD", "IOMMU_IOAS_ALLOC",
                    "VFIO_DEVICE_ATTACH_IOMMUFD_PT", "IOMMU_IOAS_IOVA_RANGES",
                    "IOMMU_IOAS_IOVA_RANGES", "VFIO_DEVICE_GET_INFO",
                    "VFIO_DEVICE_GET_REGION_INFO", "VFIO_DEVICE_GET_REGION_INFO",
                    "VFIO_DEVICE_GET_IRQ_INFO", "VFIO_DEVICE_SET_IRQS"]


def _device_path(kernel, mode, dev):
    return kernel.root / "group-device" if mode == "group" else os.path.join(dev, "vfio", "devices", "vfio0")


@pytest.mark.parametrize("mode", ["group", "iommufd"])
def test_vfio_device_end_to_end_on_fake_kernel(tmp_path, monkeypatch, mode):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)})
    kernel = FakeKernel(tmp_path).install(monkeypatch)

    async def main():
        async with await VfioDevice.open(ADDR, mode=mode, sysfs=sysfs, dev=dev) as d:
            assert isinstance(d, Device) and d.mode == mode and d.bar_size == BAR_SIZE
            assert kernel.calls == (GROUP_SEQUENCE if mode == "group" else IOMMUFD_SEQUENCE)
            path = _device_path(kernel, mode, dev)
            # config space: Memory Space and Bus Master enabled
            cmd = struct.unpack_from("<H", open(path, "rb").read(), CONFIG_OFFSET + 4)[0]
            assert cmd & 0b110 == 0b110
            # BAR0 through the mmap
            assert await d.read32(0) == MAGIC
            await d.write32(0x100, 0xCAFEF00D)
            assert open(path, "rb").read()[0x100:0x104] == b"\x0D\xF0\xFE\xCA"
            with pytest.raises(ValueError, match="outside BAR0"):
                await d.read32(BAR_SIZE)
            # alloc_dma: the device reads what the program wrote, at the bus address
            buf = d.alloc_dma(10_000, align=1 << 16)
            assert buf.bus_addr % (1 << 16) == 0 and buf.size == 10_000
            buf.view[:5] = b"hello"
            assert kernel.read_dma(buf.bus_addr, 5) == b"hello"
            # map_dma: a numpy array, not page aligned, zero-copy
            arr = np.arange(1000, dtype=np.uint32)[3:]
            m = d.map_dma(arr)
            assert m.bus_addr % 4096 == arr.ctypes.data % 4096
            assert kernel.read_dma(m.bus_addr, 8) == arr[:2].tobytes()
            arr[0] = 0xABCD
            assert kernel.read_dma(m.bus_addr, 4) == (0xABCD).to_bytes(4, "little")
            with pytest.raises(BufferNotMappable):
                d.map_dma(np.arange(10)[::2])
            ba = bytearray(100)
            mb = d.map_dma(ba)
            with pytest.raises(BufferError):
                ba.extend(b"x")          # pinned while mapped
            d.unmap_dma(mb)
            ba.extend(b"x")
            assert len(kernel.maps) == 2
            # MSI-X vectors through their eventfds
            assert len(d.irqs) == 4 and kernel.irq_index == vfio.VFIO_PCI_MSIX_IRQ_INDEX
            os.eventfd_write(kernel.irq_fds[1], 1)
            assert await d.wait_irq(1, timeout=1) == 1
            with pytest.raises(IrqTimeout):
                await d.wait_irq(0, timeout=0.01)
            with pytest.raises(IrqUnavailable, match="vector 4 not bound"):
                await d.wait_irq(4)
            d.reset()
            assert kernel.resets == 1
            fds = list(d._fds)
        assert kernel.maps == {} and kernel.irq_fds is None     # unmapped, interrupts off
        for fd in fds:
            with pytest.raises(OSError):
                os.fstat(fd)
        with pytest.raises(DeviceClosed):
            await d.read32(0)
        await d.close()                                          # twice is harmless
    asyncio.run(main())


def test_vfio_device_auto_prefers_iommufd_and_falls_back_on_permission(tmp_path, monkeypatch):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)})
    kernel = FakeKernel(tmp_path).install(monkeypatch)
    d = VfioDevice(ADDR, sysfs=sysfs, dev=dev)
    assert d.mode == "iommufd"
    asyncio.run(d.close())
    iommu = os.path.join(dev, "iommu")
    real_open = os.open

    def deny(path, *a, **k):
        if str(path) == iommu:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(vfio.os, "open", deny)
    kernel.calls.clear()
    d = VfioDevice(ADDR, sysfs=sysfs, dev=dev)
    assert d.mode == "group" and kernel.calls[0] == "VFIO_GET_API_VERSION"
    asyncio.run(d.close())
    with pytest.raises(DevicePermissionError, match="/dev/iommu|iommu"):
        VfioDevice(ADDR, mode="iommufd", sysfs=sysfs, dev=dev)


def test_vfio_device_without_cdev_uses_group(tmp_path, monkeypatch):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)}, cdev=False)
    FakeKernel(tmp_path, msix=0, msi=1).install(monkeypatch)
    with SyncDevice(VfioDevice(ADDR, sysfs=sysfs, dev=dev)) as d:
        assert d.device.mode == "group"
        assert d.read32(0) == MAGIC
        assert d.device.irq_index == vfio.VFIO_PCI_MSI_IRQ_INDEX and len(d.device.irqs) == 1
    with pytest.raises(VfioUnavailable, match="mode='iommufd' but"):
        VfioDevice(ADDR, mode="iommufd", sysfs=sysfs, dev=dev)


def test_vfio_device_group_not_viable_from_kernel(tmp_path, monkeypatch):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)}, cdev=False)
    FakeKernel(tmp_path, viable=False).install(monkeypatch)
    with pytest.raises(IommuGroupNotViable, match="IOMMU group 7 is not viable"):
        VfioDevice(ADDR, sysfs=sysfs, dev=dev)


@pytest.mark.parametrize("code", [errno.ENOMEM, errno.EPERM])
def test_vfio_dma_map_failure_says_memlock(tmp_path, monkeypatch, code):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)}, cdev=False)
    kernel = FakeKernel(tmp_path, map_errno=code).install(monkeypatch)
    d = VfioDevice(ADDR, sysfs=sysfs, dev=dev)
    free = d.dma.free_bytes
    with pytest.raises(DmaMappingError, match="VFIO_IOMMU_MAP_DMA failed") as info:
        d.alloc_dma(4096)
    assert "ulimit -l" in info.value.fix and info.value.errno == code
    assert d.dma.free_bytes == free               # the bus address range was given back
    kernel.map_errno = None
    assert d.alloc_dma(4096).bus_addr >= 1 << 20
    asyncio.run(d.close())


def test_vfio_ioctl_error_names_ioctl_and_errno(tmp_path, monkeypatch):
    sysfs, dev = make_tree(tmp_path, {ADDR: ("vfio-pci", GROUP)}, cdev=False)
    kernel = FakeKernel(tmp_path).install(monkeypatch)

    def busy(fd, arg):
        raise OSError(errno.EBUSY, "Device or resource busy")
    kernel.vfio_group_get_device_fd = busy
    with pytest.raises(VfioIoctlError, match="VFIO_GROUP_GET_DEVICE_FD failed") as info:
        VfioDevice(ADDR, sysfs=sysfs, dev=dev)
    assert info.value.errno == errno.EBUSY and "fuser" in info.value.fix
