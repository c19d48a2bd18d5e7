"""The `make sim` job as a test: stellar_pktloop on Verilator with the scapy mixed trace, its
tx.pcap compared byte for byte with the frames that must pass and dissected by tshark (an
independent dissector: no malformed packet, no expert error beyond the zero UDP checksum over
IPv6 that RoCEv2 senders commonly send)."""

import pytest
from stellar.sim import packets, pktloop_sim, tshark


@pytest.mark.parametrize("width", [64, 512])
def test_sim_job(width, tmp_path):
    rc = pktloop_sim.main(["--width", str(width), "--frames", "150", "--seed", "3",
                           "--out", str(tmp_path)])
    assert rc == 0
    sent = packets.read_pcap(tmp_path / "tx.pcap")
    assert len(sent) > 100
    assert tshark.expert_errors(tmp_path / "tx.pcap") == []
    layers = tshark.dissect(tmp_path / "tx.pcap")
    assert sum(1 for frame in layers if "infiniband" in frame) > 80
