# Ref: Xilinx PG213 "UltraScale+ Devices Integrated Block for PCI Express" (user interface
#      port names); Corundum's example designs (fpga/*/rtl/fpga_core.v) for the naming.
"""``stellar_pcie_usp``: the NIC core behind the UltraScale+ PCIe adapter.

::

    PCIe hard block (or cocotbext-pcie's UltraScalePlusPcieDevice)
      s_axis_cq / m_axis_cc --> PcieUsp --m_axil--> NicCore.s_axil   (BAR0 = the CSR map)
      m_axis_rq / s_axis_rc <-- PcieUsp <--s_axi--- NicCore.m_axi    (DMA to host memory)
      cfg_interrupt_msi_*   <-- PcieUsp <--msi----- NicCore.msi      (completion events)
    s_axis_rx, m_axis_tx: NicCore's Ethernet ports, passed through

The core runs with its queue engine (``NicCore(host_queues=True)``): the host posts work into
rings in its own memory and rings doorbells in BAR0; the NIC fetches WQEs, moves payload and
writes CQEs by DMA, and raises MSIs (``stellar.hdl.hostif.queues``). The host driver
(``stellar.host.verbs``) is the other side.

``stellar_pcie2`` holds two such NICs (ports prefixed ``a_`` and ``b_``, each with its own
``a_clk`` / ``a_rst`` and ``b_clk`` / ``b_rst`` driven by its own hard-block model): the
two-host simulation, the network between them being the testbench's switch model.

Ports: ``clk`` / ``rst`` are the hard block's ``user_clk`` / ``user_reset`` (active high);
the PCIe user interface at 64 bits with the names of Corundum's example designs
(``s_axis_cq_*``, ``m_axis_cc_*``, ``m_axis_rq_*``, ``s_axis_rc_*``, ``cfg_max_payload``,
``cfg_max_read_req``, ``cfg_interrupt_msi_*``, ``pcie_cq_np_req``), so cocotbext-pcie binds
them by prefix; the MSI inputs the adapter does not use (function number, attributes, TPH,
pending status) are outputs held at 0, as on the hard block they must be driven.

``python -m stellar.hdl.top.pcie [--qps N] [--two] -o build/verilog`` writes the Verilog.
"""

import argparse
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import DomainRenamer, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..axil import FlatPorts
from ..hostif.pcie_usp import PcieUsp, usp_members
from .nic import NicCore, nic_signature

__all__ = ["PcieNic", "PciePair", "TOP_NAME", "PAIR_NAME", "verilog_top", "convert"]

TOP_NAME = "stellar_pcie_usp"
PAIR_NAME = "stellar_pcie2"

# MSI inputs of the hard block the adapter leaves at 0 (name: width)
MSI_ZERO = {
    "cfg_interrupt_msi_select": 2,
    "cfg_interrupt_msi_pending_status": 32,
    "cfg_interrupt_msi_pending_status_data_enable": 1,
    "cfg_interrupt_msi_pending_status_function_num": 2,
    "cfg_interrupt_msi_attr": 3,
    "cfg_interrupt_msi_tph_present": 1,
    "cfg_interrupt_msi_tph_type": 2,
    "cfg_interrupt_msi_tph_st_tag": 8,
    "cfg_interrupt_msi_function_number": 8,
}


class PcieNic(wiring.Component):
    """``PcieUsp`` + ``NicCore`` (see the module docstring). Parameters: ``qps`` and the other
    ``NicCore`` keywords; ``tags`` / ``slot_bytes`` of the adapter."""

    def __init__(self, *, qps=16, tags=16, slot_bytes=512, **nic_kw):
        self.nic = NicCore(64, qps=qps, host_queues=True, **nic_kw)
        self.pcie = PcieUsp(64, tags=tags, slot_bytes=slot_bytes)
        members = dict(usp_members())
        members.update({name: Out(width) for name, width in MSI_ZERO.items()})
        for name in ("s_axis_rx", "m_axis_tx"):
            members[name] = nic_signature(64)[name]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.nic = nic = self.nic
        m.submodules.pcie = pcie = self.pcie

        for name in ("s_axis_cq", "s_axis_rc"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(pcie, name))
        for name in ("m_axis_cc", "m_axis_rq"):
            wiring.connect(m, getattr(pcie, name), wiring.flipped(getattr(self, name)))
        m.d.comb += [
            pcie.cfg_max_payload.eq(self.cfg_max_payload),
            pcie.cfg_max_read_req.eq(self.cfg_max_read_req),
            pcie.cfg_interrupt_msi_enable.eq(self.cfg_interrupt_msi_enable),
            pcie.cfg_interrupt_msi_mmenable.eq(self.cfg_interrupt_msi_mmenable),
            self.cfg_interrupt_msi_int.eq(pcie.cfg_interrupt_msi_int),
            pcie.cfg_interrupt_msi_sent.eq(self.cfg_interrupt_msi_sent),
            pcie.cfg_interrupt_msi_fail.eq(self.cfg_interrupt_msi_fail),
            self.pcie_cq_np_req.eq(pcie.pcie_cq_np_req),
            # MSI: the CQ's vector (the hard block has 32: the driver gives vectors below 32)
            pcie.msi.valid.eq(nic.msi.valid), pcie.msi.payload.eq(nic.msi.payload.vector),
            nic.msi.ready.eq(pcie.msi.ready),
        ]
        for name in MSI_ZERO:
            m.d.comb += getattr(self, name).eq(0)

        wiring.connect(m, pcie.m_axil, nic.s_axil)
        wiring.connect(m, nic.m_axi, pcie.s_axi)
        wiring.connect(m, wiring.flipped(self.s_axis_rx), nic.s_axis_rx)
        wiring.connect(m, nic.m_axis_tx, wiring.flipped(self.m_axis_tx))
        return m


class PciePair(wiring.Component):
    """Two ``PcieNic`` with their ports prefixed ``a_`` and ``b_``, in clock domains ``a`` and
    ``b`` (each PCIe hard block has its own user clock). Nothing joins them."""

    def __init__(self, **kw):
        self.a = PcieNic(**kw)
        self.b = PcieNic(**kw)
        members = {}
        for side, nic in (("a", self.a), ("b", self.b)):
            for name, member in nic.signature.members.items():
                members[f"{side}_{name}"] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for side, nic in (("a", self.a), ("b", self.b)):
            m.submodules[side] = DomainRenamer(side)(nic)
            for name, member in nic.signature.members.items():
                outer, inner = getattr(self, f"{side}_{name}"), getattr(nic, name)
                if member.is_port:
                    if member.flow == In:
                        m.d.comb += inner.eq(outer)
                    else:
                        m.d.comb += outer.eq(inner)
                elif member.flow == In:
                    wiring.connect(m, wiring.flipped(outer), inner)
                else:
                    wiring.connect(m, inner, wiring.flipped(outer))
        return m


def verilog_top(width=64, *, two=False, **kw):
    if width != 64:
        raise ValueError("stellar_pcie_usp is built at 64 bits (see stellar.hdl.hostif.pcie_usp)")
    return FlatPorts((PciePair if two else PcieNic)(**kw))


def convert(*, two=False, **kw):
    return verilog.convert(verilog_top(two=two, **kw), name=PAIR_NAME if two else TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.top.pcie",
                                 description="Write the stellar_pcie_usp Verilog top.")
    ap.add_argument("--qps", type=int, default=16, help="QP indexes")
    ap.add_argument("--two", action="store_true", help="two NICs (stellar_pcie2)")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.output) / f"{PAIR_NAME if args.two else TOP_NAME}_q{args.qps}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(qps=args.qps, two=args.two))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
