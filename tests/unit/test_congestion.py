"""stellar.sim.congestion: router2 heatmaps written by hand in nextpnr's format (one line per
tile column x with a value per row y; ``net,overuse``; per wire type the count of wires with
0, 1, 2 ... users), every figure below summed by hand."""

from stellar.sim import congestion

GRID = [  # x 0..3, y 0..4
    "0,0,0,0,0,",
    "0,6,2,0,0,",
    "0,4,8,0,0,",
    "0,0,0,0,20,",
]
NETS = """nic.csr.w_data[7],30
nic.csr.qpctx__command_stb_LUT4_C_Z,10
nic.pipe.slot__valid,25
nic.pipe.store.bit_mask[3],15
bank.wq__wr_push_stb,5
clk_core,0
"""
TYPES = """type,bound=0,bound=1,bound=2,bound=3,
WIRE_TYPE_V02,100,50,7,3,
WIRE_TYPE_H06,10,5,4,
WIRE_TYPE_SLICE,900,80,
"""


def _write(tmp_path, it):
    (tmp_path / f"heat_congestion_by_coordinate_{it}.csv").write_text("\n".join(GRID) + "\n")
    (tmp_path / f"heat_congestion_by_net_{it}.csv").write_text(NETS)
    (tmp_path / f"heat_congestion_by_wiretype_{it}.csv").write_text(TYPES)


def test_summary_by_block_type_and_region(tmp_path):
    for it in (1, 2, 10):
        _write(tmp_path, it)
    assert congestion.iterations(tmp_path) == [1, 2, 10]
    text, found = congestion.summarize(tmp_path, band=2, window=2)
    assert found["iteration"] == 10
    assert found["overused_wires"] == 7 + 3 + 4                      # users >= 2
    assert found["overused_by_type"] == {"WIRE_TYPE_V02": 10, "WIRE_TYPE_H06": 4}
    assert found["blocks"] == {"nic.csr": 40, "nic.pipe": 40, "bank": 5, "(top)": 0}
    assert list(found["nets"])[0] == "nic.csr.w_data[7]"
    # rows y: 0, 10, 10, 0, 20 of 40 -> bands of 2: y 0-1 10, 2-3 10, 4 20
    assert [b[2] for b in found["y_bands"]] == [10, 10, 20]
    assert [b[2] for b in found["x_bands"]] == [8, 32]                # x 0-1, x 2-3
    # densest 2 x 2 window: x 1-2, y 1-2 (6 + 2 + 4 + 8 = 20), ties to x 3 y 3-4 (20) broken
    # toward the larger start
    w = found["window"]
    assert (w["share"], w["size"]) == (0.5, 2) and (w["x"], w["y"]) in ((1, 1), (2, 3))
    assert "14 overused wires" in text and "nic.csr" in text
    _, three = congestion.summarize(tmp_path, levels=3, iteration=1)
    assert three["iteration"] == 1 and three["blocks"]["nic.pipe.store"] == 15
    assert three["blocks"]["nic.pipe"] == 25 and three["blocks"]["nic.csr"] == 40


def test_block_of():
    assert congestion.block_of("nic.pipe.slot__valid") == "nic.pipe"
    assert congestion.block_of("nic.pipe.store.mem.0.0_DOA0", 3) == "nic.pipe.store"
    assert congestion.block_of("nic.cc.sched.p2.sh", 5) == "nic.cc.sched.p2"
    assert congestion.block_of("clk_core") == "(top)"
    assert congestion.block_of("bank.clk") == "bank"
