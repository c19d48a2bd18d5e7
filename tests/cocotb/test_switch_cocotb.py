"""cocotb + Verilator tests of the switch model and the recording host memory
(:mod:`stellar.sim.tb_switch`) on ``switch_loop``, a stand-in for the two NIC cores.

``switch_loop`` has, per side ``x`` in (a, b), the network ports of a core (``x_m_axis_tx``,
``x_s_axis_rx``) fed from and drained to test ports through FIFOs, and an AXI4 pass-through
``s_axi`` -> ``m_axi``. (This file is not named ``test_switch.py``: ``tests/unit/test_switch.py``
has that name, and pytest refuses two test modules with one basename in a package-less tree.)
"""

import functools

import pytest
from amaranth.hdl import Cat, Const, Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from stellar.hdl.axil import FlatPorts
from stellar.hdl.axis import AxiStreamSignature
from stellar.hdl.dma.axi4 import Axi4Signature
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug

TOP = "switch_loop"


class SwitchLoop(wiring.Component):
    """Two FIFO pairs standing in for two NIC cores, and an AXI4 pass-through.

    Ports, per side ``x`` in (a, b): ``x_s_axis_in`` (In) -> TX FIFO -> ``x_m_axis_tx`` (Out),
    held (valid and ready low) while ``x_hold``; ``x_s_axis_rx`` (In) -> RX FIFO ->
    ``x_m_axis_out`` (Out), input stalled (``tready`` low) while ``x_rx_stall``. ``s_axi`` (In
    AXI4) wired straight to ``m_axi`` (Out AXI4), 32-bit addresses, 4-bit IDs.
    Parameters: ``width`` (data bits), ``depth`` (beats per FIFO). Latency: a FIFO beat takes
    two cycles from input to output (``SyncFIFOBuffered``); the AXI path none.
    """

    def __init__(self, width=64, depth=1024):
        self.width = width
        self.depth = depth
        members = {}
        for x in ("a", "b"):
            members.update({
                f"{x}_s_axis_in":  In(AxiStreamSignature(width)),
                f"{x}_m_axis_tx":  Out(AxiStreamSignature(width)),
                f"{x}_s_axis_rx":  In(AxiStreamSignature(width)),
                f"{x}_m_axis_out": Out(AxiStreamSignature(width)),
                f"{x}_hold":       In(1),
                f"{x}_rx_stall":   In(1),
            })
        members["s_axi"] = In(Axi4Signature(32, width, 4))
        members["m_axi"] = Out(Axi4Signature(32, width, 4))
        super().__init__(members)

    def _fifo(self, m, name, i, o, hold_in, hold_out):
        fifo = SyncFIFOBuffered(width=self.width + self.width // 8 + 1, depth=self.depth)
        m.submodules[name] = fifo
        m.d.comb += [
            fifo.w_data.eq(Cat(i.tdata, i.tkeep, i.tlast)),
            fifo.w_en.eq(i.tvalid & ~hold_in),
            i.tready.eq(fifo.w_rdy & ~hold_in),
            Cat(o.tdata, o.tkeep, o.tlast).eq(fifo.r_data),
            o.tvalid.eq(fifo.r_rdy & ~hold_out),
            fifo.r_en.eq(o.tready & ~hold_out),
        ]

    def elaborate(self, platform):
        m = Module()
        never = Const(0, 1)
        for x in ("a", "b"):
            port = functools.partial(getattr, self)
            self._fifo(m, f"{x}_tx", port(f"{x}_s_axis_in"), port(f"{x}_m_axis_tx"), never,
                       port(f"{x}_hold"))
            self._fifo(m, f"{x}_rx", port(f"{x}_s_axis_rx"), port(f"{x}_m_axis_out"),
                       port(f"{x}_rx_stall"), never)
        # Pass-through: the master side's outputs drive m_axi, the subordinate's come back.
        for name, member in self.m_axi.signature.members.items():
            src, dst = getattr(self.s_axi, name), getattr(self.m_axi, name)
            if member.flow == In:
                src, dst = dst, src
            m.d.comb += dst.eq(src)
        return m


# Beats per FIFO: 32 KiB, a burst of a few dozen frames of up to ~400 bytes at either width.
FIFO_BEATS = {64: 4096, 512: 512}


def verilog_top(width=64):
    return FlatPorts(SwitchLoop(width, depth=FIFO_BEATS[width]))


@functools.cache
def verilog_for(width):
    return export_verilog(TOP, verilog_top, {"width": width})


CASES = [(64, "wire_timing"), (64, "impairments"), (64, "cut_restore"), (64, "backpressure"),
         (64, "ram_writes"), (512, "wire_timing"), (512, "impairments")]


@pytest.mark.parametrize(("width", "testcase"), CASES)
def test_switch(width, testcase):
    params = {"width": width}
    run_cocotb(toplevel=TOP, verilog_sources=[verilog_for(width)],
               test_module="stellar.sim.tb_switch", params_slug=param_slug(params),
               testcase=testcase, extra_env=tb_env({**params, "fifo_beats": FIFO_BEATS[width]}))
