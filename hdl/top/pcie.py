# Ref: Xilinx PG213 "UltraScale+ Devices Integrated Block for PCI Express" (user interface
#      port names); Corundum's example designs (fpga/*/rtl/fpga_core.v) for the naming.
"""``stellar_pcie_usp``: the NIC core behind the UltraScale+ PCIe adapter.

::

    PCIe hard block (or cocotbext-pcie's UltraScalePlusPcieDevice)
      s_axis_cq / m_axis_cc --> PcieUsp --m_axil--> NicCore.s_axil   (BAR0 = the CSR map)
      m_axis_rq / s_axis_rc <-- PcieUsp <--s_axi--- NicCore.m_axi    (DMA to host memory)
      cfg_interrupt_msi_*   <-- PcieUsp <--msi----- irq_vector / irq_valid / irq_ready
    s_axis_rx, m_axis_tx, s_axis_wr, s_axis_rr, m_axis_cq: NicCore's, passed through

Ports: ``clk`` / ``rst`` are the hard block's ``user_clk`` / ``user_reset`` (active high);
the PCIe user interface at 64 bits with the names of Corundum's example designs
(``s_axis_cq_*``, ``m_axis_cc_*``, ``m_axis_rq_*``, ``s_axis_rc_*``, ``cfg_max_payload``,
``cfg_max_read_req``, ``cfg_interrupt_msi_*``, ``pcie_cq_np_req``), so cocotbext-pcie binds
them by prefix; the MSI inputs the adapter does not use (function number, attributes, TPH,
pending status) are outputs held at 0, as on the hard block they must be driven. The host
queue engine (issue 6) will replace ``s_axis_wr`` / ``s_axis_rr`` / ``m_axis_cq`` and drive
``irq_*``; until then the testbench does.

``python -m stellar.hdl.top.pcie [--qps N] -o build/verilog`` writes the Verilog.
"""

import argparse
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..axil import FlatPorts
from ..hostif.pcie_usp import PcieUsp, usp_members
from .nic import NicCore, nic_signature

__all__ = ["PcieNic", "TOP_NAME", "verilog_top", "convert"]

TOP_NAME = "stellar_pcie_usp"

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
        self.nic = NicCore(64, qps=qps, **nic_kw)
        self.pcie = PcieUsp(64, tags=tags, slot_bytes=slot_bytes)
        members = {
            **usp_members(),
            "irq":                        In(wiring.Signature({"vector": Out(5), "valid": Out(1),
                                                               "ready": In(1)})),
        }
        members.update({name: Out(width) for name, width in MSI_ZERO.items()})
        for name, member in nic_signature(64).items():
            if name not in ("m_axi", "s_axil"):
                members[name] = member
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
            pcie.msi.valid.eq(self.irq.valid), pcie.msi.payload.eq(self.irq.vector),
            self.irq.ready.eq(pcie.msi.ready),
        ]
        for name in MSI_ZERO:
            m.d.comb += getattr(self, name).eq(0)

        wiring.connect(m, pcie.m_axil, nic.s_axil)
        wiring.connect(m, nic.m_axi, pcie.s_axi)
        for name, member in nic_signature(64).items():
            if name in ("m_axi", "s_axil"):
                continue
            if member.flow == In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(nic, name))
            else:
                wiring.connect(m, getattr(nic, name), wiring.flipped(getattr(self, name)))
        return m


def verilog_top(width=64, **kw):
    if width != 64:
        raise ValueError("stellar_pcie_usp is built at 64 bits (see stellar.hdl.hostif.pcie_usp)")
    return FlatPorts(PcieNic(**kw))


def convert(**kw):
    return verilog.convert(verilog_top(**kw), name=TOP_NAME)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m stellar.hdl.top.pcie",
                                 description="Write the stellar_pcie_usp Verilog top.")
    ap.add_argument("--qps", type=int, default=16, help="QP indexes")
    ap.add_argument("-o", "--output", default="build/verilog", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.output) / f"{TOP_NAME}_q{args.qps}.v"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(convert(qps=args.qps))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
