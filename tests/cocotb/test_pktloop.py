"""cocotb + Verilator tests of the Verilog top ``stellar_pktloop`` at both data widths.

Each width gets its own generated Verilog and Verilator build (``build/sim/stellar_pktloop/
width64``...), so the parameter sets run in parallel under pytest-xdist.
"""

import functools

import pytest
from stellar.hdl.top.pktloop import TOP_NAME, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug

TESTS = ["ident_registers", "mixed_trace", "captures", "random_roundtrip", "random_corruption"]


@functools.cache
def verilog_for(width):
    return export_verilog(TOP_NAME, verilog_top, {"width": width})


@pytest.mark.parametrize("testcase", TESTS)
@pytest.mark.parametrize("width", [64, 512])
def test_pktloop(width, testcase):
    params = {"width": width}
    # Fewer frames at 512 bits: the Python BFMs, not the simulator, set the pace there.
    frames = 120 if width == 64 else 80
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[verilog_for(width)],
               test_module="stellar.sim.tb_pktloop", params_slug=param_slug(params),
               testcase=testcase, extra_env=tb_env({**params, "frames": frames}))
