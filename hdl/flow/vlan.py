# Ref: IEEE 802.1Q-2018 9.6 (VID 0: priority tag, no VLAN membership)
"""The VLAN -> tenant map: which tenant a received frame belongs to.

Each tenant has its own QP number space, so the flow-table key is (tenant, QPN) and the tenant
must come from something the tenant cannot forge on a shared port: the 802.1Q VLAN ID the switch
puts on its traffic. The host programs, per VID, whether it is mapped and to which tenant.
Untagged frames and priority-tagged frames (VID 0) belong to tenant 0; a frame with an unmapped
VID is dropped by the flow pipeline (``flow.rx_drop_tenant``).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .fields import TENANT_BITS

__all__ = ["VlanTenantMap", "VLAN_ENTRY"]

# One entry: bits 7:0 tenant, bit 8 mapped (the layout of the flow.vlan_tenant register).
VLAN_ENTRY = data.StructLayout({"tenant": TENANT_BITS, "mapped": 1})


class VlanTenantMap(wiring.Component):
    """4096-entry VID -> (mapped, tenant) table with a one-clock lookup.

    Ports
    -----
    lookup : In(stream.Signature({tagged, vid}, always_ready=True))
        One lookup per clock; ``tagged`` = the frame carries an 802.1Q tag.
    result : Out(stream.Signature(VLAN_ENTRY, always_ready=True))
        ``LATENCY`` (1) clock after the lookup. Untagged frames and VID 0 give (mapped, 0).
    cmd    : In(stream.Signature({write, vid, entry}, always_ready=True))
        Host access: ``write`` stores ``entry`` for ``vid``; otherwise a read whose entry
        appears on ``rdata`` the next clock. A lookup in the clock of a write to its VID sees
        the old or the new entry (one memory word: never a mix).
    rdata  : Out(VLAN_ENTRY)
    """

    LATENCY = 1

    def __init__(self):
        super().__init__({
            "lookup": In(stream.Signature(data.StructLayout({"tagged": 1, "vid": 12}),
                                          always_ready=True)),
            "result": Out(stream.Signature(VLAN_ENTRY, always_ready=True)),
            "cmd":    In(stream.Signature(data.StructLayout({"write": 1, "vid": 12, "entry": VLAN_ENTRY}),
                                          always_ready=True)),
            "rdata":  Out(VLAN_ENTRY),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=VLAN_ENTRY, depth=4096, init=[])
        rd = mem.read_port()
        host_rd = mem.read_port()
        wr = mem.write_port()

        untagged = Signal()
        m.d.comb += [
            rd.addr.eq(self.lookup.payload.vid),
            host_rd.addr.eq(self.cmd.payload.vid),
            wr.addr.eq(self.cmd.payload.vid),
            wr.data.eq(self.cmd.payload.entry),
            wr.en.eq(self.cmd.valid & self.cmd.payload.write),
            self.rdata.eq(host_rd.data),
        ]
        m.d.sync += [
            self.result.valid.eq(self.lookup.valid),
            untagged.eq(~self.lookup.payload.tagged | (self.lookup.payload.vid == 0)),
        ]
        with m.If(untagged):
            m.d.comb += [self.result.payload.mapped.eq(1), self.result.payload.tenant.eq(0)]
        with m.Else():
            m.d.comb += self.result.payload.eq(rd.data)
        return m
