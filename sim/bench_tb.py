"""cocotb measurement module for ``make bench`` (a benchmark, not a test: it asserts nothing).

Drives ``stellar_pktloop`` with back-to-back valid RoCEv2 frames of one size at a time, no
idle cycles on the input and the output always ready, and counts on every clock edge:

* input beats accepted and cycles from the first to the last input beat (parser throughput;
  any cycle with ``tvalid`` high and ``tready`` low is a stall the design caused),
* output beats and idle cycles between the first and the last output beat (deparser
  throughput; after the first frame the receive buffer always holds a complete frame, so an
  idle output cycle is a bubble the deparser or the buffer caused),
* latency in cycles: first input beat -> first parser output beat (probed inside the design),
  and first input beat -> first output beat of the loopback (includes the store-and-forward
  buffer that waits for each frame's ICRC verdict).

Parameters (environment): ``STELLAR_TB_WIDTH``, ``STELLAR_TB_SIZES`` (comma-separated frame
sizes in bytes), ``STELLAR_TB_BEATS`` (input beats per size, at least 8 frames),
``STELLAR_TB_OUT`` (JSON file to write).
"""

import json
import os

import cocotb
from cocotb.triggers import RisingEdge, Timer
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from . import packets
from .tb import TB, tb_param

ROCE_IPV4_OVERHEAD = 14 + 20 + 8 + 12 + 4   # Ethernet, IPv4, UDP, BTH, ICRC


def send_only_frame(size, seq):
    """An RC SEND_ONLY IPv4 frame of at most ``size`` bytes (RoCE frames are 2 mod 4 long)."""
    payload_len = max(0, size - ROCE_IPV4_OVERHEAD) & ~3
    payload = bytes((seq * 7 + i) & 0xFF for i in range(payload_len))
    return packets.roce_frame(0x04, payload=payload, bth={"psn": seq, "dest_qp": 0x11})


@cocotb.test()
async def measure(dut):
    tb = TB(dut)
    width = tb_param("width")
    nbytes = width // 8
    sizes = [int(s) for s in tb_param("sizes", str).split(",")]
    beats_goal = tb_param("beats", int, 4000)
    source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_rx"), dut.clk, dut.rst)
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_tx"), dut.clk, dut.rst)
    await tb.reset()
    parser = dut.inner.parser
    results = []
    for size in sizes:
        frame0 = send_only_frame(size, 0)
        beats_per_frame = -(-len(frame0) // nbytes)
        count = max(8, beats_goal // beats_per_frame)
        frames = [send_only_frame(size, n) for n in range(count)]
        s = {"rx": [], "tx": [], "stall": 0, "parser_first": None}
        done = {"flag": False}

        async def monitor(s, done):
            cycle = 0
            while not done["flag"]:
                await RisingEdge(dut.clk)
                cycle += 1
                rv, rr = dut.s_axis_rx_tvalid.value, dut.s_axis_rx_tready.value
                if rv and rr:
                    s["rx"].append(cycle)
                elif rv:
                    s["stall"] += 1
                if dut.m_axis_tx_tvalid.value and dut.m_axis_tx_tready.value:
                    s["tx"].append(cycle)
                if s["parser_first"] is None and parser.o_valid.value:
                    s["parser_first"] = cycle

        cocotb.start_soon(monitor(s, done))
        for f in frames:
            await source.send(AxiStreamFrame(f))
        for _ in frames:
            await sink.recv()
        await Timer(100, "ns")
        done["flag"] = True
        await RisingEdge(dut.clk)
        rx_span = s["rx"][-1] - s["rx"][0] + 1
        tx_span = s["tx"][-1] - s["tx"][0] + 1
        results.append({
            "width": width,
            "size_requested": size,
            "frame_bytes": len(frame0),
            "frames": count,
            "beats_per_frame": beats_per_frame,
            "rx_beats": len(s["rx"]),
            "rx_cycles": rx_span,
            "rx_beats_per_cycle": len(s["rx"]) / rx_span,
            "rx_stall_cycles": s["stall"],
            "tx_beats": len(s["tx"]),
            "tx_cycles": tx_span,
            "tx_beats_per_cycle": len(s["tx"]) / tx_span,
            "tx_bubbles": tx_span - len(s["tx"]),
            "parser_latency": s["parser_first"] - s["rx"][0],
            "loopback_latency": s["tx"][0] - s["rx"][0],
        })
        tb.log.info("bench %d bits, %d-byte frames: %s", width, len(frame0), results[-1])
        await tb.cycles(50)
    with open(os.environ["STELLAR_TB_OUT"], "w") as fh:
        json.dump(results, fh, indent=1)
