"""stellar.hdl.fanout: a DCCA on an ECP5, a plain wire everywhere else."""

from amaranth.hdl import Fragment, Instance, Module, Signal
from amaranth.sim import Simulator
from stellar.hdl.fanout import CORE_GLOBALS, GlobalNet, on_global
from stellar.hdl.top.nic import NicCore


class _Ecp5:
    family = "ecp5"


def _instances(fragment):
    found = []

    def walk(f):
        if isinstance(f, Instance):
            found.append(f)
        for sub, _name, _src in getattr(f, "subfragments", ()):
            walk(sub)
    walk(fragment)
    return found


def test_ecp5_gets_a_dcca():
    net = GlobalNet()
    insts = _instances(Fragment.get(net, _Ecp5()))
    assert [i.type for i in insts] == ["DCCA"]
    (dcc,) = insts
    assert dcc.ports["CLKI"][0] is net.i
    assert dcc.ports["CLKO"][0] is net.o


def test_elsewhere_a_wire():
    assert _instances(Fragment.get(GlobalNet(), None)) == []
    m = Module()
    a = Signal()
    b = on_global(m, "g", a)
    seen = []

    async def bench(ctx):
        for v in (0, 1, 1, 0):
            ctx.set(a, v)
            seen.append((v, ctx.get(b)))
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert all(v == o for v, o in seen)


def test_core_fits_the_free_globals():
    """NicCore built for an ECP5 uses no more globals than the board tops leave it."""
    dccas = [i for i in _instances(Fragment.get(NicCore(data_width=64, qps=16), _Ecp5()))
             if i.type == "DCCA"]
    assert 1 <= len(dccas) <= CORE_GLOBALS
