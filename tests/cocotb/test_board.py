"""cocotb + Verilator test of the board top ``stellar_board`` (``stellar.hdl.boards.top`` with
modelled pins: RGMII MAC + UART control bridge + NIC core + block-RAM device memory + register
queues); the testbench is ``stellar.sim.tb_board``. One Verilog export and one Verilator build
serve the three cocotb tests (one simulator run).
"""

from stellar.hdl.boards.top import TOP_NAME, BoardConfig, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug


def _top(qps, divisor):
    return verilog_top(BoardConfig(qps=qps, devmem_bytes=16 * 1024), uart_divisor=divisor)


def test_board_top():
    params = {"qps": 16, "divisor": 8}
    src = export_verilog(TOP_NAME, _top, params)
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[src], test_module="stellar.sim.tb_board",
               params_slug=param_slug(params), extra_env=tb_env(params))
