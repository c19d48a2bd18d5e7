"""cocotb + Verilator test of the Verilog top ``stellar_mac`` (RGMII 1 GbE MAC with clock-domain
crossing) against cocotbext-eth's RGMII models; the testbench is ``stellar.sim.tb_mac``.

One Verilog export and one Verilator build serve all three cocotb tests (one simulator run).
"""

from stellar.hdl.top.mac import TOP_NAME, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug


def test_rgmii_mac():
    params = {"width": 64}
    src = export_verilog(TOP_NAME, verilog_top, params)
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[src], test_module="stellar.sim.tb_mac",
               params_slug=param_slug(params), extra_env=tb_env({**params, "frames": 24}))
