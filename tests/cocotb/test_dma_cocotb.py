"""cocotb + Verilator tests of ``stellar_dma`` (the AXI4 DMA engine against cocotbext-axi's
AxiRam) at both data widths. Each parameter set gets its own generated Verilog and build."""

import functools

import pytest
from stellar.hdl.top.dma import TOP_NAME, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug


@functools.cache
def verilog_for(width):
    return export_verilog(TOP_NAME, verilog_top, {"width": width})


@pytest.mark.parametrize("width", [64, 512])
def test_dma(width):
    params = {"width": width}
    commands = 200 if width == 64 else 300
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[verilog_for(width)],
               test_module="stellar.sim.tb_dma", params_slug=param_slug(params),
               extra_env=tb_env({**params, "commands": commands}))
