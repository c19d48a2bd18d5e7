"""cocotb measurements of the RC transport between two NIC cores (``stellar_nic2``), for
``make bench`` (:mod:`stellar.sim.bench_rc`). A bench, not a test: it measures and writes JSON;
the only checks are that the data arrived (so no figure is reported for wrong data).

Cases (``STELLAR_TB_CASE``):

``goodput``   A stream of RDMA WRITEs of ``msg`` bytes from A to B on one QP, 4 KiB path MTU,
              no backpressure, the switch at wire rate (``W/8`` bytes per cycle plus 24 bytes of
              preamble, FCS and inter-frame gap per frame) with drop probability ``loss``. Goodput
              = payload bytes / cycles from the first data frame leaving A to the last new byte
              arriving at B, as a fraction of the wire limit for the same frames.
``recovery``  The same stream with exactly one data frame dropped (the 24th): cycles from the
              lost frame leaving A to its retransmission leaving A, and the frames resent.
``latency``   One 4 KiB WRITE on an idle pair: cycles from its first beat entering B's
              ``s_axis_rx`` to B's first DMA write beat (``wvalid & wready``) on ``m_axi``.
"""

import json
import os

import cocotb
from cocotb.triggers import RisingEdge
from stellar.hdl.flow.fields import PathMtu

from .nic import QpConfig
from .switch import LinkConfig
from .tb import tb_param
from .tb_nic import Harness
from .verbs import WcStatus, WorkRequest, WrOpcode

MTU = 4096
WIRE_OVERHEAD = 24           # preamble + SFD 8, FCS 4, IFG 12
HEADERS = 14 + 20 + 8 + 12   # Ethernet, IPv4, UDP, BTH
RETH, ICRC = 16, 4
WRITE_OPS = {0x06, 0x07, 0x08, 0x0A}


def ideal_wire_bytes(msg):
    """Wire bytes of one WRITE of ``msg`` bytes at 4 KiB MTU, each frame sent once."""
    n = max(1, -(-msg // MTU))
    return msg + n * (HEADERS + ICRC + WIRE_OVERHEAD) + RETH


async def _stream(h, total, msg, *, depth=12):
    """Post WRITEs of ``msg`` bytes (``total`` bytes in all), keeping ``depth`` in flight."""
    posted = done = 0
    count = total // msg
    while done < count:
        while posted < count and posted - done < depth:
            wr = WorkRequest(qp=1, wr_id=posted, opcode=WrOpcode.RDMA_WRITE, length=msg,
                             laddr=1 << 18,                              # QP 1's source area
                             raddr=(2 << 20) + (posted * msg) % (1 << 21),  # B's upper 2 MiB
                             rkey=h.nic["b"].rkey)
            await h.nic["a"].post_send(wr)
            posted += 1
        c = await h.nic["a"].poll()
        assert c.status == WcStatus.SUCCESS, c
        done += 1


def _mac_pause(link, frames=2):
    """Backpressure of a MAC with a transmit FIFO of ``frames`` 4 KiB frames: the core may not
    run ahead of the wire (at 512 bits a 65-beat frame takes 65.3 cycles of wire time, so
    without this the switch queue, and with it every go-back-N resend, would grow all run)."""
    limit = frames * link.model.wire_time(MTU + HEADERS + ICRC)
    while True:
        tb = link.timebase
        yield tb.period is not None and tb.phase is not None and \
            link.model.queue_delay(tb.cycle()) > limit


async def _setup(dut, link, back=None):
    h = Harness(dut, pause=0.0, link=link, back=back)
    for ln in h.switch.links:
        ln.sink.set_pause_generator(_mac_pause(ln))
    cfg = QpConfig(pmtu=PathMtu.MTU_4096, timeout=4)
    await h.start(1, cfg, window=64)
    return h


def _data_frames(link):
    return [r for r in link.history if r.opcode in WRITE_OPS]


@cocotb.test()
async def bench(dut):
    case = tb_param("case", str)
    out = {"case": case, "width": len(dut.a_s_axis_rx_tdata)}
    B = out["width"] // 8
    if case in ("goodput", "recovery"):
        loss = tb_param("loss", float, 0.0)
        total = tb_param("total", int, 1 << 20)
        msg = tb_param("msg", int, 1 << 16)
        # Loss on the data direction only: a lost NAK or ACK costs a local ACK timeout, which is
        # the timer's business, not go-back-N's (and the figure below is go-back-N's).
        link = LinkConfig(drop=loss if case == "goodput" else 0.0, delay=40,
                          seed=tb_param("seed", int, 1))
        h = await _setup(dut, link, LinkConfig(delay=40))
        if case == "recovery":
            lost = {"n": 0}

            def drop_24th(frame):
                from .switch import bth_opcode
                if bth_opcode(frame) in WRITE_OPS:
                    lost["n"] += 1
                    return lost["n"] == 24
                return False
            h.switch.ab.cut(drop_24th)
        await _stream(h, total, msg)
        frames = _data_frames(h.switch.ab)
        # Measured on the wire into B (the switch serializes at W/8 bytes per cycle plus the
        # per-frame overhead): from the first data frame's departure to the end of the last
        # delivered one.
        delivered = [r for r in frames if r.cycle_out is not None]
        t0 = min(r.cycle_out for r in delivered)
        t1 = max(r.cycle_out + (r.length + WIRE_OVERHEAD) / B for r in delivered)
        payload = total
        cycles = t1 - t0
        goodput = payload / cycles                               # bytes per cycle
        limit = B * (total // msg) * msg / ((total // msg) * ideal_wire_bytes(msg))
        out.update(loss=loss, total=total, msg=msg, cycles=cycles, frames_sent=len(frames),
                   frames_ideal=(total // msg) * -(-msg // MTU),
                   dropped=sum(1 for r in frames if r.cycle_out is None),
                   goodput_bytes_per_cycle=goodput, wire_limit_bytes_per_cycle=limit,
                   fraction_of_limit=goodput / limit,
                   counters_a=await h.nic["a"].counters(), counters_b=await h.nic["b"].counters())
        if case == "recovery":
            gone = next(r for r in frames if r.action == "cut")
            again = next(r for r in frames if r.psn == gone.psn and r is not gone)
            out.update(recovery_cycles=again.cycle_in - gone.cycle_in,
                       packet_cycles=(MTU + HEADERS + ICRC + WIRE_OVERHEAD) / B,
                       resent=len(frames) - out["frames_ideal"])
    elif case == "latency":
        h = await _setup(dut, LinkConfig(delay=40))
        first = {}

        async def watch():
            k = 0
            while "dma" not in first:
                await RisingEdge(dut.clk)
                k += 1
                if "rx" not in first and dut.b_s_axis_rx_tvalid.value and dut.b_s_axis_rx_tready.value:
                    first["rx"] = k
                if "rx" in first and dut.b_m_axi_wvalid.value and dut.b_m_axi_wready.value:
                    first["dma"] = k
        mon = cocotb.start_soon(watch())
        await h.nic["a"].post_send(WorkRequest(qp=1, wr_id=1, opcode=WrOpcode.RDMA_WRITE,
                                               length=MTU, laddr=1 << 18, raddr=2 << 20,
                                               rkey=h.nic["b"].rkey))
        c = await h.nic["a"].poll()
        assert c.status == WcStatus.SUCCESS, c
        await mon
        out.update(latency_cycles=first["dma"] - first["rx"])
    path = os.environ.get("STELLAR_BENCH_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)
    h.log.info("bench result: %s", out)
