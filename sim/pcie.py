"""The simulated PCIe host: cocotbext-pcie's ``RootComplex`` with its host memory
(``mem_pool``), the ``UltraScalePlusPcieDevice`` hard-block model bound to a
``stellar_pcie_usp`` top, enumeration, BAR0 and MSI.

:class:`SimPcieDevice` is the host driver's device interface on this backend (the VFIO backend
in ``stellar.host`` has the same one)::

    dev = await SimPcieDevice.attach(dut)                   # enumerate, BAR0, bus master, MSI
    await dev.write32(offset, value); value = await dev.read32(offset)    # BAR0
    buf = dev.alloc_dma(size, align=4096)                   # buf.bus_addr, buf.view
    buf = dev.map_dma(numpy_array)                          # the array itself, zero-copy
    await dev.wait_irq(vector, timeout=10e-6)               # MSI ``vector`` arrived

It is a :class:`stellar.host.device.Device`, so the host driver runs on it unchanged; its
``timeout`` is simulated time.

The model drives ``clk`` (its ``user_clk``, 250 MHz) and ``rst`` (``user_reset``) itself, as
the hard block does; a testbench must not start its own clock on ``clk``.
"""

import functools
import logging

import cocotb
from cocotb.triggers import Event, FallingEdge, Timer, with_timeout
from cocotbext.axi import AxiStreamBus
from cocotbext.axi.address_space import MemoryRegion
from cocotbext.pcie.core import RootComplex
from cocotbext.pcie.xilinx.us import UltraScalePlusPcieDevice
from stellar.host.device import PAGE_SIZE, Device, DmaBuffer, dma_view
from stellar.host.errors import DeviceError, IrqTimeout

__all__ = ["SimPcieDevice", "PcieError", "BAR0_SIZE"]

BAR0_SIZE = 1 << 16           # the CSR map's 16-bit address space
MSI_VECTORS = 32

# hard-block MSI inputs the model reads if present (stellar_pcie_usp drives them to 0)
_MSI_SIGNALS = ("enable", "mmenable", "int", "sent", "fail", "select", "pending_status",
                "pending_status_data_enable", "pending_status_function_num", "attr",
                "tph_present", "tph_type", "tph_st_tag", "function_number")


class PcieError(DeviceError, RuntimeError):
    """A BAR access the device refused (completion status not SC)."""

    code = "E5010"
    default_fix = "check the offset against stellar.hdl.regmap (python -m stellar.hdl.regmap --json)"


class _ViewRegion(MemoryRegion):
    """Simulated host memory over a buffer the program owns (``map_dma``): the root complex's
    DMA reads and writes go straight to it."""

    async def _read(self, address, length, **kwargs):
        return bytes(self.mem[address:address + length])


def _pow2(n):
    return 1 << (max(n, 1) - 1).bit_length()


class SimPcieDevice(Device):
    """A ``stellar_pcie_usp`` top behind a simulated root complex (see the module docstring).

    Parameters: ``prefix`` (the top's ports are ``{prefix}_clk``, ``{prefix}_m_axis_rq_*``, ...;
    "" for ``stellar_pcie_usp``, "a" / "b" for ``stellar_pcie2``), ``mps`` / ``mrrs`` (max
    payload and max read request size, bytes, programmed
    into the device by enumeration), ``rcb_split`` (the root complex cuts every read completion
    at the 64-byte read completion boundary instead of at the max payload size),
    ``pause`` (probability of a stalled cycle on every stream the model drives or takes:
    CQ, RC sources and RQ, CC sinks), ``seed_name`` prefix of the pause generators.
    """

    def __init__(self, dut, *, prefix="", mps=256, mrrs=512, rcb_split=True, pause=0.0,
                 log_level=logging.WARNING):
        self.dut = dut
        p = f"{prefix}_" if prefix else ""
        self.prefix = prefix
        self.clk = getattr(dut, f"{p}clk")
        self.rst = getattr(dut, f"{p}rst")
        self.log = logging.getLogger(f"cocotb.pcie{'.' + prefix if prefix else ''}")
        self.rc = RootComplex()
        self.rc.max_payload_size = (mps // 128 - 1).bit_length()
        self.rc.max_read_request_size = (mrrs // 128 - 1).bit_length()
        self.rc.split_on_all_rcb = rcb_split
        msi = {f"cfg_interrupt_msi_{n}": getattr(dut, f"{p}cfg_interrupt_msi_{n}")
               for n in _MSI_SIGNALS if hasattr(dut, f"{p}cfg_interrupt_msi_{n}")}
        self.model = UltraScalePlusPcieDevice(
            # 64-bit interface at 250 MHz: Gen3 x2 (16 Gb/s each way, one 64-bit beat a clock)
            pcie_generation=3, pcie_link_width=2, user_clk_frequency=250e6, alignment="dword",
            max_payload_size=1024, enable_client_tag=True, enable_extended_tag=False,
            pf0_msi_enable=True, pf0_msi_count=MSI_VECTORS,
            user_clk=self.clk, user_reset=self.rst,
            rq_bus=AxiStreamBus.from_prefix(dut, f"{p}m_axis_rq"),
            rc_bus=AxiStreamBus.from_prefix(dut, f"{p}s_axis_rc"),
            cq_bus=AxiStreamBus.from_prefix(dut, f"{p}s_axis_cq"),
            cc_bus=AxiStreamBus.from_prefix(dut, f"{p}m_axis_cc"),
            pcie_cq_np_req=getattr(dut, f"{p}pcie_cq_np_req"),
            cfg_max_payload=getattr(dut, f"{p}cfg_max_payload"),
            cfg_max_read_req=getattr(dut, f"{p}cfg_max_read_req"),
            **msi)
        for lg in (self.model.log, self.rc.log, self.model.rq_sink.log, self.model.rc_source.log,
                   self.model.cq_source.log, self.model.cc_sink.log,
                   *(f.log for f in self.model.functions)):
            lg.setLevel(log_level)
        self.model.functions[0].configure_bar(0, BAR0_SIZE)
        port = self.rc.make_port()
        port.log.setLevel(log_level)
        port.connect(self.model)
        if pause:
            from .tb import pause_generator
            for name, port in (("cq", self.model.cq_source), ("rc", self.model.rc_source),
                               ("rq", self.model.rq_sink), ("cc", self.model.cc_sink)):
                port.set_pause_generator(pause_generator(pause, name=f"pcie{prefix}.{name}"))
        self.pdev = None
        self.bar0 = None
        self.irq_count = 0
        # the hard block's reset ends once, early: catch it now, so a host that enumerates
        # later (the second host of stellar_pcie2, after the first) does not wait for it forever
        self._out_of_reset = Event()
        cocotb.start_soon(self._watch_reset())

    async def _watch_reset(self):
        await FallingEdge(self.rst)
        self._out_of_reset.set()

    @classmethod
    async def attach(cls, dut, **kw):
        """Build the host, wait for the hard block's reset to end, enumerate, enable memory
        space and bus mastering, allocate the MSI vectors; returns the device."""
        dev = cls(dut, **kw)
        await dev.enumerate()
        return dev

    async def enumerate(self):
        await self._out_of_reset.wait()
        await Timer(100, "ns")
        await self.rc.enumerate()
        self.pdev = self.rc.find_device(self.model.functions[0].pcie_id)
        await self.pdev.enable_device()
        await self.pdev.set_master()
        await self.pdev.alloc_irq_vectors(MSI_VECTORS, MSI_VECTORS)
        self.bar0 = self.pdev.bar_window[0]
        self.log.info("device %s: BAR0 at %#x, %d MSI vectors", self.pdev.pcie_id,
                      self.pdev.bar_addr[0], len(self.pdev.msi_vectors))

    # ------------------------------------------------------------------ the device interface
    async def read32(self, offset):
        """One 32-bit read of BAR0 at byte ``offset``. Raises :class:`PcieError` if the device
        answers with an unsuccessful completion (an unmapped register)."""
        try:
            return await self.bar0.read_dword(offset)
        except Exception as e:      # cocotbext-pcie raises a plain Exception
            if "Unsuccessful completion" in str(e):
                raise PcieError(f"BAR0 read at {offset:#06x} refused by the device (completion "
                                f"status not SC): no register there; check the offset against "
                                f"stellar.hdl.regmap") from None
            raise

    async def write32(self, offset, value):
        """One 32-bit posted write to BAR0 at byte ``offset``."""
        await self.bar0.write_dword(offset, value)

    def alloc_dma(self, size, align=PAGE_SIZE):
        """``size`` bytes of zeroed host memory aligned to ``align`` (a power of two)."""
        if align & (align - 1):
            raise ValueError(f"alignment {align} is not a power of two")
        # the pool's buddy allocator aligns every region to its (power-of-two) size
        region = self.rc.mem_pool.alloc_region(_pow2(max(size, align, 64)))
        return DmaBuffer(self, region.get_absolute_address(0), memoryview(region.mem)[:size],
                         backing=region)

    def map_dma(self, obj):
        """Map an existing buffer (numpy array, bytearray, mmap) into the simulated bus, zero-copy:
        the device's DMA reads and writes reach ``obj``'s own memory."""
        view = dma_view(obj)
        pool = self.rc.mem_pool
        n = _pow2(max(view.nbytes, PAGE_SIZE))
        base = pool.allocator.alloc(n)
        region = _ViewRegion(view.nbytes, mem=view)
        pool.register_region(region, base)
        return DmaBuffer(self, region.get_absolute_address(0), view, obj=obj, backing=region)

    def unmap_dma(self, buf):
        """The device can no longer reach ``buf`` (its bus range is not handed out again: the
        simulated pool's allocator cannot free)."""
        pool = self.rc.mem_pool
        pool.regions = [r for r in pool.regions if r[3] is not buf.backing]
        if buf.obj is not None:
            buf.release()
        else:
            buf.mapped = False

    async def wait_irq(self, vector, timeout=None):
        """Wait for MSI ``vector``; returns how many arrived since the last wait on it (the
        model counts none, so 1). ``timeout``: simulated seconds."""
        event = self.pdev.msi_vectors[vector].event
        if timeout is None:
            await event.wait()
        else:
            try:
                await with_timeout(event.wait(), round(timeout * 1e9), "ns")
            except Exception as e:
                if type(e).__name__ == "SimTimeoutError":
                    raise IrqTimeout(f"MSI vector {vector} did not arrive within {timeout * 1e6:g} "
                                     "us of simulated time", vector=vector) from None
                raise
        event.clear()
        self.irq_count += 1
        return 1

    async def close(self):
        """Nothing to release in simulation beyond the mappings (dropped with the simulator)."""
        self.bar0 = None


@functools.cache
def pcie_verilog(qps=16, two=False):
    """The ``stellar_pcie_usp`` (``two``: ``stellar_pcie2``) Verilog the PCIe testbenches run
    (exported once per process, cached on disk by ``stellar.sim.verilog``); returns
    ``(top name, path, params)``."""
    from stellar.hdl.top.pcie import PAIR_NAME, TOP_NAME, verilog_top
    from stellar.sim.verilog import export_verilog
    params = {"qps": qps, "two": True} if two else {"qps": qps}
    name = PAIR_NAME if two else TOP_NAME
    return name, export_verilog(name, verilog_top, params), params
