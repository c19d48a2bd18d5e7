"""cocotb testbench for the runner smoke test: random frames through an AXI-Stream register slice.

Parameters (``STELLAR_TB_*``, see stellar.sim.runner):
- ``width``: tdata width the design was built with; checked against the port.
- ``frames``: number of frames (default 40).
- ``corrupt``: 1 to flip one expected byte, so the comparison fails on purpose; the pytest side
  uses it to prove that a failing cocotb test fails the pytest test.
"""

import random

import cocotb
from cocotb.triggers import with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from stellar.sim.tb import TB, pause_generator, tb_param


@cocotb.test()
async def frames_pass_unchanged(dut):
    """Random-length frames with random stalls on both sides come out byte-for-byte equal."""
    width = tb_param("width")
    frames = tb_param("frames", default=40)
    corrupt = tb_param("corrupt", bool, default=False)
    assert len(dut.s_axis_tdata) == width, "design built with a different width than requested"

    tb = TB(dut)
    source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
    source.set_pause_generator(pause_generator(0.3, name="source"))
    sink.set_pause_generator(pause_generator(0.3, name="sink"))
    await tb.reset()

    # Lengths straddle beat boundaries (1 byte, exact beats, beats + a partial last beat) so
    # tkeep on the last beat is exercised at every width.
    lanes = width // 8
    sent = [random.randbytes(random.randint(1, 4 * lanes + 3)) for _ in range(frames)]
    for data in sent:
        await source.send(AxiStreamFrame(data))

    for index, data in enumerate(sent):
        received = await with_timeout(sink.recv(), 100 * (len(data) // lanes + 10) * tb.period_ns, "ns")
        expected = bytearray(data)
        if corrupt and index == frames // 2:
            expected[0] ^= 0xFF
        assert received.tdata == expected, f"frame {index}: {received.tdata.hex()} != {expected.hex()}"

    assert sink.empty()
