"""Simulated hosts for the driver-level testbenches and the two-host ``make sim``: the host
driver (``stellar.host.verbs``) on a ``stellar_pcie_usp`` NIC behind cocotbext-pcie's root
complex (``stellar.sim.pcie``), and the verbs steps every RC connection goes through.

::

    host = SimHost(dut, "a", mac=..., ip="10.0.0.1")       # ports a_* of stellar_pcie2
    await host.start()                                      # enumerate, open, GID 0
    qa, qb = ...                                            # ctx.create_qp on each host
    await connect(qa, host_a, qb, host_b, psn_a=..., psn_b=...)   # both QPs to RTS
    wcs = await poll_until(cq, n, clock, timeout_cycles)    # polls host memory only
"""

import logging

from cocotb.triggers import ClockCycles
from stellar.hdl.flow.fields import Access, PathMtu, QpState
from stellar.host.verbs import AHAttr, Context, QPAttr

from .pcie import SimPcieDevice

__all__ = ["SimHost", "connect", "poll_until", "ALL_ACCESS"]

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


class SimHost:
    """One simulated host: ``device`` (:class:`SimPcieDevice`), ``ctx`` (the driver's
    :class:`~stellar.host.verbs.Context`), its address ``mac`` / ``ip``."""

    def __init__(self, dut, prefix="", *, mac, ip, pause=0.0, name=None):
        self.name = name or prefix or "host"
        self.device = SimPcieDevice(dut, prefix=prefix, pause=pause)
        self.clk = self.device.clk
        self.mac, self.ip = mac, ip
        self.ctx = None
        self.log = logging.getLogger(f"cocotb.host.{self.name}")

    async def start(self, *, tick_cycles=None):
        await self.device.enumerate()
        self.ctx = await Context.open(self.device)
        await self.ctx.set_gid(0, mac=self.mac, ip=self.ip)
        if tick_cycles is not None:
            await self.ctx.mmio.write32(self.ctx.tables.map["transport.tick_cycles"].offset,
                                        tick_cycles)
        a = self.ctx.query_device()
        self.log.info("%s: Stellar %s, %d QPs, %d CQs, %d MRs, features %s", self.name, a.fw_ver,
                      a.max_qp, a.max_cq, a.max_mr, ", ".join(a.features))
        return self


async def connect(qa, host_a, qb, host_b, *, psn_a, psn_b, mtu=PathMtu.MTU_1024, timeout=14,
                  retry_cnt=7, rnr_retry=7, min_rnr_timer=1, traffic_class=0x02, before_rtr=None):
    """RESET -> INIT -> RTR -> RTS for both QPs of an RC connection (the attributes an
    out-of-band exchange would carry: QPN, PSN, MAC, IP). ``before_rtr``: an async callable
    run with both QPs in INIT (to post receives there)."""
    for qp in (qa, qb):
        await qp.modify(QPAttr(qp_state=QpState.INIT, pkey_index=0, port_num=1,
                               qp_access_flags=ALL_ACCESS))
    if before_rtr is not None:
        await before_rtr()
    for qp, peer_qp, peer, rq_psn in ((qa, qb, host_b, psn_b), (qb, qa, host_a, psn_a)):
        await qp.modify(QPAttr(qp_state=QpState.RTR, path_mtu=mtu, dest_qp_num=peer_qp.qp_num,
                               rq_psn=rq_psn, max_dest_rd_atomic=4, min_rnr_timer=min_rnr_timer,
                               ah_attr=AHAttr(dgid=peer.ip, dmac=peer.mac,
                                              traffic_class=traffic_class)))
    for qp, sq_psn in ((qa, psn_a), (qb, psn_b)):
        await qp.modify(QPAttr(qp_state=QpState.RTS, sq_psn=sq_psn, timeout=timeout,
                               retry_cnt=retry_cnt, rnr_retry=rnr_retry, max_rd_atomic=4))


async def poll_until(cq, n, clock, timeout_cycles=200_000, *, step=8):
    """Poll ``cq`` (host memory only) until ``n`` completions came; returns them. Raises
    ``TimeoutError`` naming how many came."""
    out = []
    waited = 0
    while len(out) < n:
        got = await cq.poll(n - len(out))
        out.extend(got)
        if not got:
            if waited >= timeout_cycles:
                raise TimeoutError(f"CQ {cq.number}: {len(out)} of {n} completions after "
                                   f"{timeout_cycles} cycles: {out}")
            await ClockCycles(clock, step)
            waited += step
    return out
