# Ref: ARM IHI 0022E (AMBA AXI4), ARM IHI 0051B (AXI4-Stream)
"""cocotb testbench of ``stellar_dma`` (:mod:`stellar.hdl.top.dma`): the DMA engine against
cocotbext-axi's ``AxiRam`` as host memory.

Structure as in Corundum's testbenches: a TB class binds the BFMs by prefix (``AxiRam`` on
``m_axi``, ``AxiStreamSource`` on ``s_axis_wcmd`` / ``s_axis_wdata`` / ``s_axis_rcmd``,
``AxiStreamSink`` on ``m_axis_rdata``), random pauses on every AXI channel and every stream.
``AxiRam`` itself asserts that no burst crosses a 4 KiB boundary. The reference is a Python
``bytearray`` of the whole memory with each write applied in command order.

Memory: a 1 MiB ``AxiRam`` seen at bus address ``HIGH`` (the RAM wraps addresses modulo its
size, so the upper address bits travel through the engine without a 2**64-byte model): writes go
to the lower half, reads of untouched data come from the upper half.

Parameters (``STELLAR_TB_*``): ``width`` (64 or 512), ``commands`` (random commands per
direction, default 200), ``pause`` (stall probability on every channel, default 0.3).
"""

import random

import cocotb
from cocotb.triggers import Event, FallingEdge, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiBus, AxiRam, AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from .tb import TB, pause_generator, tb_param

MEM_SIZE = 1 << 20
HALF = MEM_SIZE // 2
HIGH = 0xFEDC_BA98_7600_0000            # a multiple of MEM_SIZE
MAX_LEN = 0xFFFF


class DmaTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.width = tb_param("width")
        self.nbytes = self.width // 8
        pause = tb_param("pause", float, 0.3)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=MEM_SIZE)
        self.wcmd = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_wcmd"), dut.clk, dut.rst)
        self.wdata = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_wdata"), dut.clk, dut.rst)
        self.rcmd = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_rcmd"), dut.clk, dut.rst)
        self.rdata = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_rdata"), dut.clk, dut.rst)
        if pause:
            channels = {
                "aw": self.ram.write_if.aw_channel, "w": self.ram.write_if.w_channel,
                "b": self.ram.write_if.b_channel, "ar": self.ram.read_if.ar_channel,
                "r": self.ram.read_if.r_channel, "wcmd": self.wcmd, "wdata": self.wdata,
                "rcmd": self.rcmd, "rdata": self.rdata,
            }
            for name, bfm in channels.items():
                bfm.set_pause_generator(pause_generator(pause, name=name))
        self.done = []                    # wr_done_error of every wr_done pulse
        self.done_event = Event()
        self.image = bytearray(random.Random(cocotb.RANDOM_SEED).randbytes(MEM_SIZE))
        self.ram.write(0, bytes(self.image))
        cocotb.start_soon(self._watch_done())

    async def _watch_done(self):
        # Sampled at the falling edge, where the registered pulse is stable.
        while True:
            await FallingEdge(self.dut.clk)
            if self.dut.wr_done.value:
                self.done.append(int(self.dut.wr_done_error.value))
                self.done_event.set()

    @staticmethod
    def _cmd(addr, length):
        return AxiStreamFrame(((HIGH + addr) | length << 64).to_bytes(10, "little"))

    async def write(self, addr, payload):
        """Queue a write of ``payload`` at memory offset ``addr`` (command and data)."""
        assert addr + len(payload) <= MEM_SIZE
        self.image[addr:addr + len(payload)] = payload
        await self.wcmd.send(self._cmd(addr, len(payload)))
        # A zero-length command still carries one beat, with tkeep 0.
        await self.wdata.send(AxiStreamFrame(payload) if payload else AxiStreamFrame(b"\0", tkeep=[0]))

    async def read(self, addr, length):
        await self.rcmd.send(self._cmd(addr, length))

    async def recv(self, length):
        """The next read's bytes; checks its beat count and that tkeep is a prefix of ones."""
        frame = await self.rdata.recv(compact=False)
        nb = self.nbytes
        beats = len(frame.tdata) // nb
        assert len(frame.tdata) % nb == 0 and beats == max(1, -(-length // nb)), (
            f"read of {length} bytes came as {len(frame.tdata)} lanes")
        assert list(frame.tkeep) == [1] * length + [0] * (len(frame.tdata) - length), (
            f"read of {length} bytes: tkeep not a prefix of {length} ones")
        return bytes(frame.tdata[:length])

    async def wait_done(self, count, timeout_us):
        async def wait():
            while len(self.done) < count:
                self.done_event.clear()
                await self.done_event.wait()
        await with_timeout(wait(), timeout_us, "us")

    def timeout_us(self, nbytes, commands):
        beats = nbytes // self.nbytes + 4 * commands
        return 200 + beats * 40 * 4 // 1000     # every beat may stall a few times; 4 ns clock


def random_length(rng, nbytes):
    r = rng.random()
    if r < 0.08:
        return 0
    if r < 0.4:
        return rng.randint(1, 3 * nbytes)
    if r < 0.85:
        return rng.randint(1, 1500)
    return rng.randint(1500, 9000)


def random_commands(rng, nbytes, count, lo, hi):
    """``count`` (offset, len) in [lo, hi): random lengths (0..9000, one 65535), random
    offsets, some straddling a 4 KiB boundary."""
    cmds = []
    for k in range(count):
        n = MAX_LEN if k == count // 2 else random_length(rng, nbytes)
        if n and n < 4096 and rng.random() < 0.2:
            page = rng.randrange(lo // 4096 + 1, hi // 4096)
            addr = page * 4096 - rng.randint(1, n) if n > 1 else page * 4096 - 1
        else:
            addr = rng.randrange(lo, hi - n)
        cmds.append((addr, n))
    return cmds


@cocotb.test()
async def random_traffic(dut):
    """Random writes (lengths 0..9000 and one 65535, any alignment, overlapping) into the lower
    half and random reads of the upper half, at once, under random pauses everywhere: memory
    equals the reference byte for byte (nothing outside the written ranges changed), every
    read returns the memory's bytes, one ``wr_done`` per write, no error reported."""
    tb = DmaTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED + 1)
    count = tb_param("commands", int, 200)
    wcmds = random_commands(rng, tb.nbytes, count, 0, HALF)
    rcmds = random_commands(rng, tb.nbytes, count, HALF, MEM_SIZE)
    payloads = [rng.randbytes(n) for _, n in wcmds]
    expect = [bytes(tb.image[a:a + n]) for a, n in rcmds]    # the upper half never changes
    start = get_sim_time("ns")

    async def writer():
        for (a, _), p in zip(wcmds, payloads, strict=True):
            await tb.write(a, p)

    async def reader():
        for a, n in rcmds:
            await tb.read(a, n)

    cocotb.start_soon(writer())
    cocotb.start_soon(reader())
    total = sum(n for _, n in wcmds) + sum(n for _, n in rcmds)
    timeout = tb.timeout_us(total, 2 * count)
    for k, ((a, n), want) in enumerate(zip(rcmds, expect, strict=True)):
        got = await with_timeout(tb.recv(n), timeout, "us")
        assert got == want, f"read {k} ({a:#x}+{n}): first difference at byte " + str(
            next(i for i in range(n) if got[i] != want[i]))
    await tb.wait_done(count, timeout)
    await tb.cycles(50)
    assert len(tb.done) == count, f"{len(tb.done)} wr_done pulses for {count} writes"
    assert not any(tb.done), "wr_done_error set with an OKAY-only memory"
    mem = tb.ram.read(0, MEM_SIZE)
    if mem != tb.image:
        bad = next(i for i in range(MEM_SIZE) if mem[i] != tb.image[i])
        raise AssertionError(f"memory differs first at offset {bad:#x}")
    for name in ("wr_errors", "rd_errors"):
        assert getattr(dut, name).value.to_unsigned() == 0, name
    assert int(dut.wr_error.value) == 0 and int(dut.rd_error.value) == 0
    cycles = (get_sim_time("ns") - start) / tb.period_ns
    tb.log.info("%d writes (%d B) and %d reads (%d B) in %d cycles", count,
                sum(n for _, n in wcmds), count, sum(n for _, n in rcmds), cycles)


@cocotb.test()
async def read_after_done(dut):
    """Each write's ``wr_done`` makes its data readable: the moment it pulses, a read of the
    same range is issued and returns what was written (writes to disjoint slots, random
    lengths and offsets)."""
    tb = DmaTB(dut)
    await tb.reset()
    rng = random.Random(cocotb.RANDOM_SEED + 2)
    count = max(8, tb_param("commands", int, 200) // 4)
    slot = HALF // count
    writes = []
    for k in range(count):
        n = rng.randint(0, min(slot - 1, 3000))
        writes.append((k * slot + rng.randint(0, slot - 1 - n), rng.randbytes(n)))

    async def writer():
        for a, p in writes:
            await tb.write(a, p)

    async def reader():
        seen = 0
        while seen < count:
            while len(tb.done) <= seen:
                tb.done_event.clear()
                await tb.done_event.wait()
            a, p = writes[seen]
            await tb.read(a, len(p))
            seen += 1

    cocotb.start_soon(writer())
    cocotb.start_soon(reader())
    timeout = tb.timeout_us(2 * sum(len(p) for _, p in writes), 2 * count)
    for k, (a, p) in enumerate(writes):
        got = await with_timeout(tb.recv(len(p)), timeout, "us")
        assert got == p, f"write {k} ({a:#x}+{len(p)}) read back different bytes"
    assert not any(tb.done)
