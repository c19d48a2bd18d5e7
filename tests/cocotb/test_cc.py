"""cocotb + Verilator tests of congestion control and QoS on two NIC cores (``stellar_nic2``)
through the switch model (``stellar.sim.tb_cc``): DCQCN incast, tenant buckets, strict priority.
They share the 64-bit ``stellar_nic2`` build with ``test_nic.py``.
"""

import pytest
from stellar.hdl.top.nic import PAIR_NAME
from stellar.sim.nic import pair_verilog
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import param_slug


def run(testcase, width=64, **params):
    params = {"width": width, **params}
    run_cocotb(toplevel=PAIR_NAME, verilog_sources=[pair_verilog(width)],
               test_module="stellar.sim.tb_cc", params_slug=param_slug({"width": width}),
               testcase=testcase, extra_env=tb_env(params))


@pytest.mark.parametrize("mode", ["dcqcn"])
def test_incast(mode):
    run("incast", flows=4, mode=mode)


def test_tenants():
    run("tenants")


def test_priority():
    run("priority")


def test_cnp_latency():
    run("cnp_latency")
