"""Shared pieces of cocotb testbenches: clock and reset, parameters, random backpressure.

Every Stellar top has ``clk`` and an active-high synchronous ``rst`` (Amaranth's ``sync``
domain), so one base class starts the clock and sequences the reset; BFMs are bound on top of it
by prefix, as in Corundum's testbenches::

    @cocotb.test()
    async def frames_roundtrip(dut):
        tb = TB(dut)
        source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        source.set_pause_generator(pause_generator(0.2, name="source"))
        sink.set_pause_generator(pause_generator(0.2, name="sink"))
        await tb.reset()
        ...

Parameters a pytest test passes through :func:`stellar.sim.runner.tb_env` arrive as
``STELLAR_TB_<NAME>`` environment variables; :func:`tb_param` reads them back.
"""

import logging
import os
import random
import zlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from .runner import TB_ENV_PREFIX

__all__ = ["TB", "AxilRegs", "pause_generator", "tb_param"]

T = TypeVar("T")
_UNSET = object()


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def tb_param(name: str, cast: Callable[[str], T] = int, default=_UNSET) -> T:
    """Read testbench parameter ``name`` from ``STELLAR_TB_<NAME>``.

    ``cast`` converts the text (``int`` by default; ``bool`` accepts ``1/0/true/false/yes/no``).
    Without ``default`` a missing variable is an error naming the variable, so a testbench never
    silently runs with a parameter set other than the one its build was made for.
    """
    var = TB_ENV_PREFIX + name.upper()
    text = os.environ.get(var)
    if text is None:
        if default is _UNSET:
            raise LookupError(f"testbench parameter {name!r} missing: set {var} "
                           f"(stellar.sim.runner.tb_env does this for run_cocotb)")
        return default
    return _parse_bool(text) if cast is bool else cast(text)


def pause_generator(probability: float, *, seed: int | None = None, name: str = "") -> Iterator[bool]:
    """Endless pause pattern for cocotbext-axi ``set_pause_generator``: one flag per clock.

    ``AxiStreamSource``/``AxiStreamSink`` (and the AXI/AXI-Lite channel BFMs) draw one value per
    rising edge and hold ``tvalid``/``tready`` low while it is true, so ``probability`` is the
    fraction of stalled cycles, independently drawn each cycle.

    ``seed`` defaults to one derived from cocotb's per-test seed and ``name``: rerunning with the
    same ``COCOTB_RANDOM_SEED`` repeats the pattern, and differently named generators (source vs
    sink) do not stall in lockstep. The seed is logged. Drawing from a private
    ``random.Random`` leaves the global ``random`` stream, and with it the test's stimulus,
    unchanged by how many cycles the pauses ran.
    """
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"pause probability {probability} is not within [0, 1]")
    if seed is None:
        seed = (cocotb.RANDOM_SEED + zlib.crc32(name.encode())) & 0xFFFF_FFFF
    logging.getLogger("cocotb.tb").info("pause generator %r: probability %.2f, seed %d",
                                        name, probability, seed)
    return _pauses(random.Random(seed), probability)


def _pauses(rng: random.Random, probability: float) -> Iterator[bool]:
    while True:
        yield rng.random() < probability


class TB:
    """Base for Stellar testbenches: starts the clock on ``dut.clk`` and owns the reset.

    Ports used: ``clk`` (clock input) and ``rst`` (active-high synchronous reset input).
    Parameters: ``period_ns`` of the clock (default 4 ns, 250 MHz: a 64-bit datapath at this
    rate carries 16 Gb/s, 512 bits carry 128 Gb/s, enough for the 10/100 GbE-class tests).

    ``rst`` is driven high from construction, so logic sees reset until :meth:`reset` releases it,
    whatever the testbench does first.
    """

    def __init__(self, dut, *, period_ns: float = 4.0):
        self.dut = dut
        self.log = logging.getLogger("cocotb.tb")
        self.period_ns = period_ns
        dut.rst.value = 1
        Clock(dut.clk, period_ns, unit="ns").start()

    async def reset(self, cycles: int = 4) -> None:
        """Hold ``rst`` high for ``cycles`` clock cycles, release it, and return one clock later."""
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, cycles)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def cycles(self, count: int) -> None:
        """Wait ``count`` rising edges of ``clk``."""
        await ClockCycles(self.dut.clk, count)


class AxilRegs:
    """``read32``/``write32`` over cocotbext-axi's AXI4-Lite master: the driver's device view."""

    def __init__(self, axil):
        self.axil = axil

    async def read32(self, offset):
        return await self.axil.read_dword(offset)

    async def write32(self, offset, value):
        await self.axil.write_dword(offset, value)
