"""Host access to the flow-pipeline tables through the register map: VLAN->tenant map, flow
table, QP contexts and memory regions.

Transport-agnostic and async, like the rest of the driver: every function takes ``regs``, any
object with ``async read32(offset)`` and ``async write32(offset, value)`` on the CSR space
(a cocotb AXI4-Lite master in simulation, a BAR mapping on PCIe, a UART bridge on the boards).
Offsets and formats come from the one register map (``stellar.hdl.regmap``) and the field
tables (``stellar.hdl.flow.fields``); nothing here imports amaranth or cocotb.

Errors speak: a refused command raises :class:`TableError` (``E6001``; ``FlowTableFull``
``E6002``) naming the table, the key and the reason, never a bare status code; a memory-region
command the device does not finish within the poll limit raises ``MrRegistrationTimeout``
(``E1001``). The classes live in ``stellar.host.errors`` and are re-exported here.
"""

from dataclasses import dataclass

from stellar.hdl.flow.fields import MR_ENTRY, QP_CONTEXT, FlowOp, FlowStatus, make_key
from stellar.hdl.regmap import REGMAP

from .errors import FlowTableFull, MrRegistrationTimeout, TableError

__all__ = ["TableError", "FlowResult", "FlowTableFull", "Tables"]

# MR command codes (the mr.command register; stellar.hdl.flow.mr.MrOp)
MR_READ_ENTRY, MR_WRITE_ENTRY, MR_READ_PAGE, MR_WRITE_PAGE = range(4)
QP_READ, QP_WRITE = 1, 2
VLAN_WRITE, VLAN_READ = 1, 2
# status register: bit 0 busy everywhere; the "command ignored while busy" bit per block
_ERROR_BIT = {"flow": 1 << 3, "qpctx": 1 << 1, "mr": 1 << 1}


@dataclass(frozen=True)
class FlowResult:
    status: FlowStatus
    value: int       # QP index (lookup, or the one already stored for EXISTS)
    cycles: int      # clocks the command took in the device


class Tables:
    """The flow-pipeline tables of one device.

    ``regs`` provides ``read32``/``write32``; ``poll_limit`` bounds the status polls of one
    command (a device that never finishes raises TableError instead of hanging).
    """

    def __init__(self, regs, *, regmap=REGMAP, poll_limit=10_000):
        self.regs = regs
        self.map = regmap
        self.poll_limit = poll_limit

    def _off(self, name):
        return self.map[name].offset

    async def _w(self, name, value):
        await self.regs.write32(self._off(name), value)

    async def _r(self, name):
        return await self.regs.read32(self._off(name))

    async def _wait(self, block):
        for _ in range(self.poll_limit):
            status = await self._r(f"{block}.status")
            if not status & 1:
                if status & _ERROR_BIT[block]:
                    raise TableError(f"{block}: the device ignored a command written while busy",
                                     fix="wait for the previous command (status.busy clear) "
                                         "before writing the next; only one program may drive "
                                         "the table window at a time", block=block)
                return status
        cause = f"{block}: command still busy after {self.poll_limit} status reads"
        if block == "mr":
            raise MrRegistrationTimeout(cause, block=block, polls=self.poll_limit)
        raise TableError(cause, fix="check that the device is alive and out of reset (`stellar "
                                    "info`); raise poll_limit only for a slow simulated clock",
                         block=block, polls=self.poll_limit)

    # --- geometry ------------------------------------------------------------------------

    async def config(self):
        """Sizes of the tables as built: ``{qps, ways, stash, flow_latency, mr_entries, mr_pages}``."""
        flow = await self._r("flow.config")
        mr = await self._r("mr.config")
        return {"qps": 1 << (flow & 0x1F), "ways": (flow >> 8) & 0xF, "stash": (flow >> 12) & 0xFF,
                "tenant_bits": (flow >> 20) & 0xFF, "flow_latency": flow >> 28,
                "mr_entries": 1 << (mr & 0xFF), "mr_pages": 1 << ((mr >> 8) & 0xFF)}

    # --- VLAN -> tenant ------------------------------------------------------------------

    async def map_vlan(self, vid, tenant, *, mapped=True):
        """Frames tagged ``vid`` belong to ``tenant`` (``mapped=False``: they are dropped)."""
        if not 1 <= vid <= 4094:
            raise ValueError(f"VLAN ID {vid}: only 1..4094 can be mapped (untagged and VID 0 are "
                             "always tenant 0)")
        await self._w("flow.vlan_vid", vid)
        await self._w("flow.vlan_tenant", (tenant & 0xFF) | (int(mapped) << 8))
        await self._w("flow.vlan_command", VLAN_WRITE)

    async def vlan_tenant(self, vid):
        """``(mapped, tenant)`` of ``vid`` as stored."""
        await self._w("flow.vlan_vid", vid)
        await self._w("flow.vlan_command", VLAN_READ)
        word = await self._r("flow.vlan_result")
        return bool(word >> 8 & 1), word & 0xFF

    # --- flow table ----------------------------------------------------------------------

    async def flow_command(self, op, tenant, qpn, value=0):
        await self._w("flow.key_tenant", tenant)
        await self._w("flow.key_qpn", qpn)
        if op == FlowOp.INSERT:
            await self._w("flow.value", value)
        await self._w("flow.command", op)
        status = await self._wait("flow")
        return FlowResult(FlowStatus((status >> 1) & 3), await self._r("flow.result_value"),
                          await self._r("flow.result_cycles"))

    async def insert_flow(self, tenant, qpn, qp_index):
        """Steer (tenant, QPN) to QP ``qp_index``. Raises if the key exists or the table is full."""
        r = await self.flow_command(FlowOp.INSERT, tenant, qpn, qp_index)
        if r.status == FlowStatus.EXISTS:
            raise TableError(f"flow (tenant {tenant}, QPN {qpn:#x}) already steers to QP index "
                             f"{r.value}", fix="delete it first (delete_flow)", tenant=tenant,
                             qpn=qpn, qp_index=r.value)
        if r.status == FlowStatus.FULL:
            raise FlowTableFull(f"flow table full inserting (tenant {tenant}, QPN {qpn:#x})",
                                tenant=tenant, qpn=qpn)
        return r

    async def delete_flow(self, tenant, qpn):
        r = await self.flow_command(FlowOp.DELETE, tenant, qpn)
        if r.status == FlowStatus.NOT_FOUND:
            raise TableError(f"flow (tenant {tenant}, QPN {qpn:#x}) is not in the table",
                             fix="delete only flows inserted before (lookup_flow tells)",
                             tenant=tenant, qpn=qpn)
        return r

    async def lookup_flow(self, tenant, qpn):
        """QP index of (tenant, QPN), or None."""
        r = await self.flow_command(FlowOp.LOOKUP, tenant, qpn)
        return r.value if r.status == FlowStatus.OK else None

    async def flow_occupancy(self):
        return await self._r("flow.occupancy"), await self._r("flow.stash_used")

    # --- QP contexts ---------------------------------------------------------------------

    async def write_qp(self, index, fields=None, **kw):
        """Set the given fields of QP ``index``'s context; the others keep their value (the
        device merges them in order with packet traffic, so no transport update is lost)."""
        values = {**(fields or {}), **kw}
        word = QP_CONTEXT.pack(values)
        for i, w in enumerate(QP_CONTEXT.to_words(word)):
            await self._w(f"qpctx.wdata{i}", w)
        await self._w("qpctx.index", index)
        await self._w("qpctx.mask", QP_CONTEXT.mask(values))
        await self._w("qpctx.command", QP_WRITE)
        await self._wait("qpctx")

    async def read_qp(self, index):
        """Context of QP ``index`` as a dict of fields."""
        await self._w("qpctx.index", index)
        await self._w("qpctx.command", QP_READ)
        await self._wait("qpctx")
        words = [await self._r(f"qpctx.rdata{i}") for i in range(QP_CONTEXT.words)]
        return QP_CONTEXT.unpack(QP_CONTEXT.from_words(words))

    # --- memory regions ------------------------------------------------------------------

    async def _mr_command(self, op, index, value=0):
        for i, w in enumerate(MR_ENTRY.to_words(value)):
            await self._w(f"mr.wdata{i}", w)
        await self._w("mr.index", index)
        await self._w("mr.command", op)
        await self._wait("mr")

    async def write_mr(self, index, *, tag, tenant, pd, access, va, length, bus_base=0,
                       pages=None, page_shift=12, pbl_index=0):
        """Register MR ``index``; returns its key (index << 8 | tag).

        Contiguous (``bus_base``) or page list (``pages``: bus addresses written to the page
        table from ``pbl_index``; the first page holds byte ``va``).
        """
        if pages is not None:
            for i, page in enumerate(pages):
                await self.write_page(pbl_index + i, page)
        entry = MR_ENTRY.pack(valid=1, tag=tag, tenant=tenant, pd=pd, access=int(access), va=va,
                              length=length, page_list=int(pages is not None),
                              bus_base=bus_base if pages is None else 0,
                              pbl_index=pbl_index if pages is not None else 0,
                              page_shift=page_shift if pages is not None else 0)
        await self._mr_command(MR_WRITE_ENTRY, index, entry)
        return make_key(index, tag)

    async def invalidate_mr(self, index):
        await self._mr_command(MR_WRITE_ENTRY, index, 0)

    async def read_mr(self, index):
        await self._mr_command(MR_READ_ENTRY, index)
        words = [await self._r(f"mr.rdata{i}") for i in range(MR_ENTRY.words)]
        return MR_ENTRY.unpack(MR_ENTRY.from_words(words))

    async def write_page(self, index, bus_addr):
        await self._mr_command(MR_WRITE_PAGE, index, bus_addr)

    async def read_page(self, index):
        await self._mr_command(MR_READ_PAGE, index)
        return await self._r("mr.rdata0") | (await self._r("mr.rdata1")) << 32
