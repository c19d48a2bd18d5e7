"""cocotb + Verilator tests of ``stellar_hostq`` (the queue engine, its DMA and the AXI4 arbiter
against cocotbext-axi's AxiRam, a Python host driver and a transport stand-in: sim/tb_hostq.py).
Each parameter set gets its own generated Verilog and build."""

import functools

import pytest
from stellar.hdl.top.hostq import TOP_NAME, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug

BUILD = {"qps": 4, "cqs": 2, "sq_depth": 4, "rq_depth": 4}


@functools.cache
def verilog_for(width):
    return export_verilog(TOP_NAME, verilog_top, {"width": width, **BUILD})


@pytest.mark.parametrize("width", [64, 512])
def test_hostq(width):
    params = {"width": width}
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[verilog_for(width)],
               test_module="stellar.sim.tb_hostq", params_slug=param_slug(params),
               extra_env=tb_env({**params, **BUILD, "wqes": 160}))
