# Ref: IBTA Vol 1 Annex A17 (RoCEv2); ARM IHI 0051B (AXI4-Stream handshake)
"""cocotb benchmarks of the packet engine: exact cycle counts, written as JSON (not tests).

One cocotb test per bench top of :mod:`stellar.sim.bench_tops`, run by
:mod:`stellar.sim.bench` (``make bench``) through :func:`stellar.sim.runner.run_cocotb`:

``bench_parser``    frames into ``s_axis``; payload and records out of ``m_axis``/``m_meta``.
``bench_deparser``  records into ``s_meta`` and payload into ``s_axis``; frames out of ``m_axis``.
``bench_pktloop``   frames into ``s_axis_rx`` of ``stellar_pktloop``; frames out of ``m_axis_tx``.

For every frame size the DUT is reset, then every input is held valid from the first cycle
until its last beat is accepted (back-to-back frames, no source gaps) and every output's
``tready`` is high throughout (no downstream stall). What is left is the block's own behaviour.

Why a hand-written cycle loop instead of cocotbext-axi sources and sinks: the numbers must be
exact, so one coroutine drives and observes every port in lockstep. Inputs change just after a
rising edge; handshakes are sampled at the falling edge, when everything (including a
``tready`` that depends combinationally on ``tvalid``) has settled to what the next rising edge
will see. A beat counts as transferred in cycle ``c`` when ``tvalid & tready`` at that sample.
Cycle 0 is the first cycle after reset in which the inputs are valid.

What is measured, per (block, width, frame size), at each stream port (``in`` and ``out``):
  * ``beats_per_cycle``: beats transferred / cycles from the first to the last transfer;
  * ``bubbles``: idle cycles between the last beat of one frame and the first of the next;
  * ``stalls``: idle cycles inside frames;
  * ``trace``: for the first idle cycle found, the transfer pattern around it
    (``F`` first beat, ``=`` middle beat, ``L`` last beat, ``B`` single-beat frame, ``.`` idle).
The line-rate target (1.00 beats per cycle, 0 bubbles) applies to the parser's input, the
deparser's output, and both ports of the loopback. Latency, per frame: parser, first input beat
to first payload beat; deparser, record accepted to first frame beat; loopback, first rx beat to
first tx beat (including the store-and-forward receive buffer, so it grows with the frame).
Each output is checked too (payload and verdict, rebuilt frame, looped frame against the input),
so a rate is never reported for a block that produced wrong data; failures land in ``errors``.

Frames: valid RoCEv2 RC frames over IPv4 built with scapy (:func:`stellar.sim.packets.roce_frame`),
alternating SEND_ONLY and RDMA_WRITE_ONLY (RETH) where the size leaves room for a WRITE, so
two header lengths and payload alignments are mixed. A RoCEv2 frame is 14 + 20 + 8 + 12 bytes of
headers + extension headers + payload and pad (multiples of 4) + 4 bytes of ICRC, so its length
is always 2 mod 4: the nominal sizes (64, 128, ..., 9000, multiples of 4) cannot be hit, and each
size ``N`` is benchmarked with the largest RoCEv2 frame not longer than ``N``, ``N - 2`` bytes
(62 bytes for 64: SEND_ONLY with 4 payload bytes). The JSON gives both.

Parameters (``STELLAR_TB_*``, see :func:`stellar.sim.tb.tb_param`):
  ``width``       data width the top was built with (checked against the port).
  ``sizes``       comma-separated nominal frame sizes in bytes.
  ``beats``       beats per size to send at least (the frame count follows from it) ...
  ``min_frames``  ... and at least this many frames.
  ``out``         path of the JSON file to write (a list with one entry per size).
"""

import json
import math
import random
from itertools import pairwise
from pathlib import Path

import cocotb
from cocotb.triggers import FallingEdge, RisingEdge
from stellar.hdl.net import headers as H
from stellar.hdl.net.layout import DropReason, record_layout
from stellar.sim.packets import roce_frame
from stellar.sim.tb import TB, tb_param

__all__ = ["bench_frames", "frame_record", "SEND_ONLY", "WRITE_ONLY"]

SEND_ONLY = 0x04        # RC SEND_ONLY: BTH only
WRITE_ONLY = 0x0A       # RC RDMA_WRITE_ONLY: BTH + RETH
FIXED_HEADERS = H.ETH.size + H.IPV4.size + H.UDP.size + H.BTH.size
ICRC_BYTES = 4
POOL = 64               # distinct frames built per size; longer runs repeat them
RECORD = record_layout()


# --------------------------------------------------------------------------------------------
# Stimulus
# --------------------------------------------------------------------------------------------

def frame_bytes(size):
    """Length of the frame benchmarked for nominal size ``size``: the largest RoCEv2 frame
    length (always 2 mod 4) that is not longer than ``size``."""
    length = size - (size - 2) % 4
    if length < FIXED_HEADERS + ICRC_BYTES + 4:
        raise ValueError(f"{size}-byte frames cannot carry a RoCEv2 SEND with payload")
    return length


def bench_frames(size, count, seed=1):
    """``count`` valid RoCEv2 frames of ``frame_bytes(size)`` bytes: ``(opcode, frame, payload)``.

    SEND_ONLY and RDMA_WRITE_ONLY alternate when the size leaves room for a WRITE with payload.
    Payloads are random (seeded, so every run sends the same bytes); the PSN counts up.
    """
    length = frame_bytes(size)
    rng = random.Random(seed * 100003 + size)
    opcodes = [SEND_ONLY]
    if length - FIXED_HEADERS - H.RETH.size - ICRC_BYTES > 0:
        opcodes.append(WRITE_ONLY)
    pool = []
    for i in range(min(count, POOL)):
        opcode = opcodes[i % len(opcodes)]
        ext_len = H.ext_layout(opcode)[1]
        payload = rng.randbytes(length - FIXED_HEADERS - ext_len - ICRC_BYTES)
        ext = {"reth": {"va": 0x1000_0000 + 0x10000 * i, "rkey": 0x1234,
                        "dma_length": len(payload)}} if opcode == WRITE_ONLY else None
        frame = roce_frame(opcode, payload=payload, bth={"psn": i, "dest_qp": 0x11}, ext=ext)
        assert len(frame) == length, (len(frame), length)
        pool.append((opcode, frame, payload))
    return [pool[i % len(pool)] for i in range(count)]


def frame_record(frame):
    """The header record (an int in ``record_layout()`` bit order) of a frame built by
    :func:`bench_frames`, decoded with the shared header table, as the deparser expects it."""
    values = {"roce": 1}
    eth = H.ETH.unpack(frame)
    assert eth["ethertype"] == H.ETHERTYPE_IPV4, "bench frames are untagged IPv4"
    ip = H.IPV4.unpack(frame, H.ETH.size)
    assert ip["ihl"] == 5, "bench frames carry no IPv4 options"
    pos = H.ETH.size + H.IPV4.size
    udp = H.UDP.unpack(frame, pos)
    bth = H.BTH.unpack(frame, pos + H.UDP.size)
    pos += H.UDP.size + H.BTH.size
    parsed = {H.ETH: eth, H.IPV4: ip, H.UDP: udp, H.BTH: bth}
    offsets, ext_len = H.ext_layout(bth["opcode"])
    for h in H.EXT_HEADERS:
        if h.name in offsets:
            parsed[h] = h.unpack(frame, pos + offsets[h.name])
    for h, fields in parsed.items():
        for name, value in fields.items():
            values[f"{h.name}_{name}"] = value
    ip_end = H.ETH.size + ip["total_length"]
    values["payload_len"] = ip_end - ICRC_BYTES - (pos + ext_len) - bth["pad_count"]
    values["frame_len"] = len(frame)
    word = 0
    for name, value in values.items():
        field = RECORD[name]
        assert 0 <= value < (1 << field.width), name
        word |= value << field.offset
    return word


def record_field(word, name):
    field = RECORD[name]
    return (word >> field.offset) & ((1 << field.width) - 1)


def beats_of(data, nbytes):
    """AXI4-Stream beats ``(tdata, tkeep, tlast)`` of ``data`` (at least one beat)."""
    chunks = [data[i:i + nbytes] for i in range(0, len(data), nbytes)] or [b""]
    return [(int.from_bytes(c, "little"), (1 << len(c)) - 1, int(i == len(chunks) - 1))
            for i, c in enumerate(chunks)]


# --------------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------------

class Source:
    """Drives one DUT input: valid from cycle 0 until every item is accepted, no gaps.

    ``items``: ``(frame index, values for handles)``; one item per beat (or record).
    """

    def __init__(self, name, valid, ready, handles, items):
        self.name = name
        self.valid, self.ready, self.handles, self.items = valid, ready, handles, items
        self.pos = 0
        self.fired = False
        self.fires = []     # (cycle, frame index, first beat of frame, last beat of frame)
        self._apply()

    def _apply(self):
        if self.pos < len(self.items):
            for handle, value in zip(self.handles, self.items[self.pos][1], strict=True):
                handle.value = value
            self.valid.value = 1
        else:
            self.valid.value = 0

    @property
    def done(self):
        return self.pos == len(self.items)

    def sample(self, cycle):
        self.fired = not self.done and bool(self.ready.value)
        if self.fired:
            frame = self.items[self.pos][0]
            first = self.pos == 0 or self.items[self.pos - 1][0] != frame
            last = self.pos + 1 == len(self.items) or self.items[self.pos + 1][0] != frame
            self.fires.append((cycle, frame, first, last))

    def advance(self):
        if self.fired:
            self.pos += 1
            self._apply()


class Sink:
    """Observes one AXI4-Stream output with ``tready`` held high; collects frames and, when a
    ``meta`` handle is given, its value at each frame's last beat."""

    def __init__(self, name, dut, prefix, nbytes, meta=None):
        self.name = name
        self.nbytes = nbytes
        self.valid = getattr(dut, f"{prefix}_tvalid")
        self.data = getattr(dut, f"{prefix}_tdata")
        self.keep = getattr(dut, f"{prefix}_tkeep")
        self.last = getattr(dut, f"{prefix}_tlast")
        self.meta = meta
        getattr(dut, f"{prefix}_tready").value = 1
        self.frames, self.metas = [], []
        self.fires = []
        self._buf = bytearray()
        self._first = True

    def sample(self, cycle):
        if not self.valid.value:
            return
        keep = self.keep.value.to_unsigned()
        nkeep = keep.bit_length()
        if keep != (1 << nkeep) - 1:
            raise AssertionError(f"{self.name}: tkeep {keep:#x} is not contiguous from lane 0")
        data = self.data.value.to_unsigned().to_bytes(self.nbytes, "little")
        self._buf += data[:nkeep]
        last = bool(self.last.value)
        self.fires.append((cycle, len(self.frames), self._first, last))
        self._first = last
        if last:
            self.frames.append(bytes(self._buf))
            self._buf.clear()
            if self.meta is not None:
                self.metas.append(self.meta.value.to_unsigned())


async def run_cycles(dut, sources, sinks, expected_frames, limit):
    """Clock the DUT until every source is drained and every sink has its frames.

    Returns the cycle count, or None when ``limit`` cycles passed first (a hang).
    """
    cycle = 0
    while not (all(s.done for s in sources) and all(len(k.frames) >= expected_frames for k in sinks)):
        if cycle >= limit:
            return None
        await FallingEdge(dut.clk)
        for port in (*sources, *sinks):
            port.sample(cycle)
        await RisingEdge(dut.clk)
        for source in sources:
            source.advance()
        cycle += 1
    return cycle


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

def frame_spans(fires):
    """Per frame: ``[first cycle, last cycle, beats]`` from a port's transfer log."""
    spans = {}
    for cycle, frame, _first, _last in fires:
        span = spans.setdefault(frame, [cycle, cycle, 0])
        span[1] = cycle
        span[2] += 1
    return [spans[f] for f in sorted(spans)]


def trace_around(fires, cycle, before=6, after=26):
    """The transfer pattern of a port over cycles ``[cycle - before, cycle + after)``."""
    marks = {}
    for c, _frame, first, last in fires:
        marks[c] = "B" if first and last else "F" if first else "L" if last else "="
    lo = max(cycle - before, min(marks))
    hi = min(cycle + after, max(marks) + 1)
    return f"cycles {lo}..{hi - 1}: " + "".join(marks.get(c, ".") for c in range(lo, hi))


def port_stats(fires):
    """Rate, bubbles, in-frame stalls and (at the first idle cycle) the trace of one port."""
    spans = frame_spans(fires)
    if not spans:
        return {"beats": 0, "cycles": 0, "beats_per_cycle": 0.0, "bubbles": 0, "max_bubble": 0,
                "bubble_histogram": {}, "stalls": 0, "trace": None}
    beats = sum(s[2] for s in spans)
    cycles = spans[-1][1] - spans[0][0] + 1
    gaps = [b[0] - a[1] - 1 for a, b in pairwise(spans)]
    stalls = [s[1] - s[0] + 1 - s[2] for s in spans]
    histogram = {}
    for g in gaps:
        histogram[str(g)] = histogram.get(str(g), 0) + 1
    trace = None
    if beats != cycles:
        busy = {c for c, *_ in fires}
        idle = next(c for c in range(spans[0][0], spans[-1][1]) if c not in busy)
        trace = trace_around(fires, idle)
    return {
        "beats": beats,
        "cycles": cycles,
        # Rounded for reading; beats and cycles above are the exact counts.
        "beats_per_cycle": round(beats / cycles, 4),
        "bubbles": sum(gaps),
        "max_bubble": max(gaps, default=0),
        "bubble_histogram": histogram,   # idle cycles between frames -> how many frame pairs
        "stalls": sum(stalls),
        "trace": trace,
    }


def latency_stats(starts, firsts, labels):
    """Per-frame latency ``first output cycle - start cycle``: the first frame's, min and max
    over all frames, and min/max per label (the opcode: the header length moves the parser's)."""
    # zip stops at the shorter list: a frame that never came out (a hang) has no latency.
    lat = [(first - start, label) for start, first, label in zip(starts, firsts, labels, strict=False)]
    if not lat:
        return {"first": None, "min": None, "max": None, "by_opcode": {}}
    by_label = {}
    for value, label in lat:
        lo, hi = by_label.get(label, (value, value))
        by_label[label] = (min(lo, value), max(hi, value))
    return {"first": lat[0][0], "min": min(v for v, _ in lat), "max": max(v for v, _ in lat),
            "by_opcode": {k: list(v) for k, v in sorted(by_label.items())}}


def first_cycles(fires):
    """Cycle of each frame's first transfer."""
    return [c for c, _frame, first, _last in fires if first]


# --------------------------------------------------------------------------------------------
# Benches
# --------------------------------------------------------------------------------------------

def _params(dut, port):
    width = tb_param("width")
    assert len(getattr(dut, port)) == width, "design built with a different width than requested"
    sizes = [int(s) for s in tb_param("sizes", str).split(",")]
    return width, width // 8, sizes, tb_param("beats"), tb_param("min_frames"), tb_param("out", str)


def _frame_count(size, nbytes, beats, min_frames):
    per_frame = math.ceil(frame_bytes(size) / nbytes)
    return max(min_frames, math.ceil(beats / per_frame))


def _case(block, width, size, frames, primary):
    return {
        "block": block, "width": width, "size": size, "frame_bytes": len(frames[0][1]),
        "opcodes": sorted({H.opcode_name(op) for op, _f, _p in frames}),
        "frames": len(frames), "primary": primary, "ok": True, "errors": [],
    }


def _opcode_labels(frames):
    return [H.opcode_name(op) for op, _f, _p in frames]


def _fail(case, message):
    case["ok"] = False
    if len(case["errors"]) < 5:     # the first few say what went wrong; the rest are noise
        case["errors"].append(message)


def _progress(tb, case):
    """One log line per case, marked ``BENCH`` so :mod:`stellar.sim.bench` can show it live."""
    ports = ("in", "out") if case["primary"] == "both" else (case["primary"],)
    rates = ", ".join(f"{p} {case['ports'][p]['beats']}/{case['ports'][p]['cycles']} beats/cycles "
                      f"({case['ports'][p]['bubbles']} bubbles, {case['ports'][p]['stalls']} stalls)"
                      for p in ports)
    lat = case["latency"]
    tb.log.info("BENCH %s w%d %dB x%d: %s; latency %s..%s%s", case["block"], case["width"],
                case["frame_bytes"], case["frames"], rates, lat["min"], lat["max"],
                "" if case["ok"] else "; DATA ERRORS: " + " | ".join(case["errors"]))


def _write(path, results):
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def _frame_items(frames, nbytes):
    return [(f, beat) for f, (_op, frame, _p) in enumerate(frames) for beat in beats_of(frame, nbytes)]


@cocotb.test()
async def bench_parser(dut):
    """Parser: rate and bubbles at its input; latency to the first payload beat."""
    width, nbytes, sizes, beats, min_frames, out = _params(dut, "s_axis_tdata")
    tb = TB(dut)
    results = []
    for size in sizes:
        frames = bench_frames(size, _frame_count(size, nbytes, beats, min_frames))
        await tb.reset()
        src = Source("s_axis", dut.s_axis_tvalid, dut.s_axis_tready,
                     (dut.s_axis_tdata, dut.s_axis_tkeep, dut.s_axis_tlast), _frame_items(frames, nbytes))
        sink = Sink("m_axis", dut, "m_axis", nbytes, meta=dut.m_meta)
        case = _case("parser", width, size, frames, primary="in")
        cycles = await run_cycles(dut, [src], [sink], len(frames), 4 * len(src.items) + 1000)
        if cycles is None:
            _fail(case, f"timeout: {src.pos}/{len(src.items)} beats in, {len(sink.frames)} frames out")
        for i, (payload, meta) in enumerate(zip(sink.frames, sink.metas, strict=True)):
            expect = frames[i][2]
            reason = DropReason(record_field(meta, "reason")).name
            if record_field(meta, "drop") or payload != expect:
                _fail(case, f"frame {i}: drop={record_field(meta, 'drop')} ({reason}), "
                            f"payload {len(payload)} bytes, expected {len(expect)}")
        case["ports"] = {"in": port_stats(src.fires), "out": port_stats(sink.fires)}
        case["latency"] = latency_stats(first_cycles(src.fires), first_cycles(sink.fires),
                                        _opcode_labels(frames))
        results.append(case)
        _progress(tb, case)
    _write(out, results)


@cocotb.test()
async def bench_deparser(dut):
    """Deparser: rate and bubbles at its output; latency from record to first frame beat."""
    width, nbytes, sizes, beats, min_frames, out = _params(dut, "m_axis_tdata")
    tb = TB(dut)
    results = []
    for size in sizes:
        frames = bench_frames(size, _frame_count(size, nbytes, beats, min_frames))
        await tb.reset()
        records = [(f, (frame_record(frame),)) for f, (_op, frame, _p) in enumerate(frames)]
        payload = [(f, beat) for f, (_op, _frame, pay) in enumerate(frames) for beat in beats_of(pay, nbytes)]
        meta_src = Source("s_meta", dut.s_meta_valid, dut.s_meta_ready, (dut.s_meta_payload,), records)
        pay_src = Source("s_axis", dut.s_axis_tvalid, dut.s_axis_tready,
                         (dut.s_axis_tdata, dut.s_axis_tkeep, dut.s_axis_tlast), payload)
        sink = Sink("m_axis", dut, "m_axis", nbytes)
        case = _case("deparser", width, size, frames, primary="out")
        total_beats = sum(math.ceil(len(f) / nbytes) for _op, f, _p in frames)
        cycles = await run_cycles(dut, [meta_src, pay_src], [sink], len(frames), 4 * total_beats + 1000)
        if cycles is None:
            _fail(case, f"timeout: {meta_src.pos} records and {pay_src.pos} payload beats in, "
                        f"{len(sink.frames)} frames out")
        for i, got in enumerate(sink.frames):
            if got != frames[i][1]:
                _fail(case, f"frame {i}: rebuilt frame differs from the original ({len(got)} bytes, "
                            f"expected {len(frames[i][1])})")
        case["ports"] = {"in": port_stats(pay_src.fires), "out": port_stats(sink.fires)}
        case["latency"] = latency_stats([c for c, *_ in meta_src.fires], first_cycles(sink.fires),
                                        _opcode_labels(frames))
        results.append(case)
        _progress(tb, case)
    _write(out, results)


@cocotb.test()
async def bench_pktloop(dut):
    """stellar_pktloop: rate and bubbles at rx and tx; first rx beat to first tx beat."""
    width, nbytes, sizes, beats, min_frames, out = _params(dut, "s_axis_rx_tdata")
    tb = TB(dut)
    # The CSR bus stays idle: the loopback needs no configuration.
    for name in ("awvalid", "wvalid", "bready", "arvalid", "rready"):
        getattr(dut, f"s_axil_{name}").value = 0
    results = []
    for size in sizes:
        frames = bench_frames(size, _frame_count(size, nbytes, beats, min_frames))
        await tb.reset()
        src = Source("s_axis_rx", dut.s_axis_rx_tvalid, dut.s_axis_rx_tready,
                     (dut.s_axis_rx_tdata, dut.s_axis_rx_tkeep, dut.s_axis_rx_tlast),
                     _frame_items(frames, nbytes))
        sink = Sink("m_axis_tx", dut, "m_axis_tx", nbytes)
        case = _case("pktloop", width, size, frames, primary="both")
        cycles = await run_cycles(dut, [src], [sink], len(frames), 4 * len(src.items) + 2000)
        if cycles is None:
            _fail(case, f"timeout: {src.pos}/{len(src.items)} beats in, {len(sink.frames)} frames out")
        for i, got in enumerate(sink.frames):
            if got != frames[i][1]:
                _fail(case, f"frame {i}: looped frame differs from the one sent")
        case["ports"] = {"in": port_stats(src.fires), "out": port_stats(sink.fires)}
        case["latency"] = latency_stats(first_cycles(src.fires), first_cycles(sink.fires),
                                        _opcode_labels(frames))
        results.append(case)
        _progress(tb, case)
    _write(out, results)
