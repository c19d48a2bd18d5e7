"""cocotb + Verilator: one NIC core (``stellar_nic``) against the RC reference model
(``stellar.sim.rcmodel``) on seeded random packet sequences, responder and requester side
(:mod:`stellar.sim.tb_rcmodel`). ``STELLAR_SEED=<n>`` replays a seed (it is printed and named in
any failure).
"""

import functools
import os
import random

import pytest
from stellar.hdl.top.nic import TOP_NAME, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug


@functools.cache
def nic_verilog(width):
    return export_verilog(TOP_NAME, verilog_top, {"width": width, "qps": 16})


def run(width, testcase, **params):
    if "STELLAR_SEED" in os.environ:
        seed = int(os.environ["STELLAR_SEED"])
    else:
        seed = random.SystemRandom().randrange(1 << 31)
    print(f"{testcase}: seed {seed} (STELLAR_SEED={seed} replays it)")
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[nic_verilog(width)],
               test_module="stellar.sim.tb_rcmodel", params_slug=param_slug({"width": width}),
               testcase=testcase, seed=seed,
               extra_env=tb_env({"width": width, "seed": seed, **params}))


@pytest.mark.parametrize("width,pmtu", [(64, 1), (512, 3)])
def test_responder(width, pmtu):
    run(width, "responder", pmtu=pmtu, steps=int(os.environ.get("STELLAR_TB_STEPS", 300)))


@pytest.mark.parametrize("width,pmtu", [(64, 1), (512, 3)])
def test_requester(width, pmtu):
    run(width, "requester", pmtu=pmtu, steps=int(os.environ.get("STELLAR_TB_STEPS", 400)))
