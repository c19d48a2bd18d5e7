"""stellar.sim.rcmodel and stellar.sim.verbs: the RC transport reference model, scenario by
scenario from the transport contract (rcspec), then end to end over a lossy channel.

The scenarios spell the expected packets, PSNs, syndromes, completions and memory writes out by
hand from the contract, so they are an independent check of the model. The randomized run
connects two model NICs over a seeded channel that drops, duplicates and reorders, and lets the
scoreboard (which knows nothing of the transport) judge the result: every byte where it
belongs, written exactly once, every completion in order. A planted responder bug shows that run
can fail.
"""

import os
import random

import pytest
from stellar.sim.rcmodel import (
    Ack,
    InMsg,
    MemWrite,
    Packet,
    PairSim,
    ReadResponse,
    RequesterModel,
    ResponderModel,
    Reth,
    apply_writes,
    read_response_packets,
)
from stellar.sim.scoreboard import Scoreboard, SparseMemory
from stellar.sim.verbs import (
    RNR_TIMER_US,
    AckType,
    Completion,
    NakCode,
    Opcode,
    QpState,
    RecvRequest,
    WcOpcode,
    WcStatus,
    WorkRequest,
    WrOpcode,
    ack_syndrome,
    ack_timeout_us,
    decode_syndrome,
    mtu_bytes,
    nak_syndrome,
    packets,
    psn_ahead,
    psn_behind,
    psn_diff,
    rnr_syndrome,
)

S = WcStatus.SUCCESS
ACK = 0x1F
NAK_SEQ, NAK_INV, NAK_ACCESS = 0x60, 0x61, 0x62


def seeds(default):
    """``STELLAR_SEED=<n>`` replays one seed."""
    if "STELLAR_SEED" in os.environ:
        return [int(os.environ["STELLAR_SEED"])]
    return default


def pattern(n, salt=0):
    return bytes((i * 7 + salt) & 0xFF for i in range(n))


def drain(req):
    out = []
    while (p := req.next_packet()) is not None:
        out.append(p)
    return out


def summary(pkts):
    return [(p.opcode, p.psn, p.ackreq, p.length) for p in pkts]


def req_and_mem(**kw):
    mem = SparseMemory()
    mem.load(0x1000, pattern(4096))
    return RequesterModel(pmtu=1, mem=mem, **kw), mem


def write_only(psn, n=16, ackreq=False, va=0x5000):
    return Packet(Opcode.WRITE_ONLY, psn, ackreq, payload=pattern(n), reth=Reth(va, 0x99, n))


# --- verbs ---------------------------------------------------------------------------------------

def test_verbs_values():
    # rdma-core verbs.h values, typed in from the header.
    assert [int(x) for x in WrOpcode] == [0, 1, 2, 3, 4, 9]
    assert {x.name: int(x) for x in WcOpcode} == {
        "SEND": 0, "RDMA_WRITE": 1, "RDMA_READ": 2, "RECV": 128, "RECV_RDMA_WITH_IMM": 129}
    assert {x.name: int(x) for x in WcStatus} == {
        "SUCCESS": 0, "LOC_LEN_ERR": 1, "LOC_QP_OP_ERR": 2, "LOC_PROT_ERR": 4, "WR_FLUSH_ERR": 5,
        "BAD_RESP_ERR": 7, "LOC_ACCESS_ERR": 8, "REM_INV_REQ_ERR": 9, "REM_ACCESS_ERR": 10,
        "REM_OP_ERR": 11, "RETRY_EXC_ERR": 12, "RNR_RETRY_EXC_ERR": 13}
    assert Opcode.SEND_LAST_INV == 0x16 and Opcode.ACKNOWLEDGE == 0x11 and Opcode.READ_RESP_ONLY == 0x10
    assert [o for o in Opcode if o.has_aeth] == [Opcode.READ_RESP_FIRST, Opcode.READ_RESP_LAST,
                                                 Opcode.READ_RESP_ONLY, Opcode.ACKNOWLEDGE]
    with pytest.raises(ValueError):
        WorkRequest(0, 1, WrOpcode.SEND, inline=bytes(33))


def test_syndromes_psns_sizes_timers():
    assert ack_syndrome() == 0x1F and rnr_syndrome(14) == 0x2E and nak_syndrome(3) == 0x63
    assert decode_syndrome(0x1F) == (AckType.ACK, 31)
    assert decode_syndrome(0x2E) == (AckType.RNR, 14)
    assert decode_syndrome(0x62) == (AckType.NAK, NakCode.REM_ACCESS)
    assert decode_syndrome(0x41).kind is AckType.RESERVED
    assert decode_syndrome(0x9F).kind is AckType.RESERVED
    assert psn_diff(1, 0xFFFFFF) == 2 and psn_diff(0xFFFFFF, 1) == 0xFFFFFE
    assert psn_ahead(1, 0xFFFFFF) and psn_behind(0xFFFFFF, 1)
    assert psn_ahead(0x7FFFFF, 0) and not psn_ahead(0x800000, 0) and psn_behind(0x800000, 0)
    assert not psn_ahead(5, 5) and not psn_behind(5, 5)
    assert [mtu_bytes(c) for c in range(1, 6)] == [256, 512, 1024, 2048, 4096]
    with pytest.raises(ValueError):
        mtu_bytes(0)
    assert [packets(n, 256) for n in (0, 1, 256, 257, 512, 513)] == [1, 1, 1, 2, 2, 3]
    assert len(RNR_TIMER_US) == 32
    assert RNR_TIMER_US[0] == 655360 and RNR_TIMER_US[1] == 10 and RNR_TIMER_US[5] == 60
    assert RNR_TIMER_US[14] == 1280 and RNR_TIMER_US[31] == 491520
    assert all(a < b for a, b in zip(RNR_TIMER_US[1:-1], RNR_TIMER_US[2:], strict=True))
    assert ack_timeout_us(0) is None and ack_timeout_us(1) == pytest.approx(8.192)
    assert ack_timeout_us(14) == pytest.approx(67108.864)


# --- in-order traffic ----------------------------------------------------------------------------

def test_send_in_order():
    req, mem = req_and_mem(sq_psn=100)
    resp = ResponderModel(pmtu=1, ack_coalesce=8, epsn=100)
    rr = RecvRequest(0, 7, 0x9000, 1000)
    resp.post_recv(rr)
    req.post(WorkRequest(0, 1, WrOpcode.SEND_WITH_IMM, laddr=0x1000, length=600, imm=0xABCD))
    pkts = drain(req)
    assert summary(pkts) == [(Opcode.SEND_FIRST, 100, False, 256),
                             (Opcode.SEND_MIDDLE, 101, False, 256),
                             (Opcode.SEND_LAST_IMM, 102, True, 88)]
    assert [p.imm for p in pkts] == [None, None, 0xABCD]
    assert pkts[1].payload == pattern(4096)[256:512] and pkts[1].src == (0x1100, 256)
    assert req.npsn == 103 and req.una == 100 and req.timer_armed and req.timer_kind == "ack"
    src = pattern(4096)[:600]
    outs = [resp.receive(p) for p in pkts]
    assert outs[0] == [MemWrite(0x9000, src[:256], 0, rr)]
    assert outs[1] == [MemWrite(0x9100, src[256:512], 256, rr)]
    assert outs[2] == [MemWrite(0x9200, src[512:], 512, rr),
                       Completion(0, 7, S, WcOpcode.RECV, byte_len=600, imm=0xABCD, is_recv=True),
                       Ack(102, ACK, 1)]
    assert (resp.epsn, resp.msn, resp.in_msg, resp.nak_sent) == (103, 1, InMsg.NONE, False)
    assert req.receive(outs[2][-1].packet()) == [Completion(0, 1, S, WcOpcode.SEND, byte_len=600)]
    assert req.una == 103 and req.idle and not req.timer_armed


def test_write_with_imm_and_zero_length():
    req, _ = req_and_mem(sq_psn=0)
    resp = ResponderModel(pmtu=1, ack_coalesce=100)
    rr = RecvRequest(0, 9, 0x7000, 0)
    resp.post_recv(rr)
    req.post(WorkRequest(0, 1, WrOpcode.RDMA_WRITE_WITH_IMM, laddr=0x1000, length=513,
                         raddr=0x5000, rkey=0x1234, imm=77))
    req.post(WorkRequest(0, 2, WrOpcode.RDMA_WRITE, raddr=0x6000, rkey=0x1234, length=0))
    req.post(WorkRequest(0, 3, WrOpcode.RDMA_WRITE, raddr=0x6100, rkey=0x1234, inline=b"hello"))
    pkts = drain(req)
    assert summary(pkts) == [(Opcode.WRITE_FIRST, 0, False, 256), (Opcode.WRITE_MIDDLE, 1, False, 256),
                             (Opcode.WRITE_LAST_IMM, 2, True, 1), (Opcode.WRITE_ONLY, 3, True, 0),
                             (Opcode.WRITE_ONLY, 4, True, 5)]
    assert [p.reth for p in pkts] == [Reth(0x5000, 0x1234, 513), None, None, Reth(0x6000, 0x1234, 0),
                                      Reth(0x6100, 0x1234, 5)]
    assert pkts[2].imm == 77 and pkts[4].payload == b"hello" and pkts[4].src is None
    outs = [resp.receive(p) for p in pkts]
    src = pattern(4096)
    assert outs[0] == [MemWrite(0x5000, src[:256], 0)]
    assert outs[1] == [MemWrite(0x5100, src[256:512], 256)]
    assert outs[2] == [MemWrite(0x5200, src[512:513], 512),
                       Completion(0, 9, S, WcOpcode.RECV_RDMA_WITH_IMM, byte_len=513, imm=77,
                                  is_recv=True),
                       Ack(2, ACK, 1)]
    assert outs[3] == [Ack(3, ACK, 2)]                      # zero length: no memory write
    assert outs[4] == [MemWrite(0x6100, b"hello", 0), Ack(4, ACK, 3)]
    got = []
    for o in outs[2:]:
        got += req.receive(o[-1].packet())
    assert [(c.wr_id, c.status, c.opcode) for c in got] == [
        (1, S, WcOpcode.RDMA_WRITE), (2, S, WcOpcode.RDMA_WRITE), (3, S, WcOpcode.RDMA_WRITE)]


def test_read():
    local = SparseMemory()
    req = RequesterModel(pmtu=1, sq_psn=10, mem=local)
    remote = SparseMemory()
    remote.load(0x8000, pattern(700, 3))
    resp = ResponderModel(pmtu=1, epsn=10)
    req.post(WorkRequest(0, 5, WrOpcode.RDMA_READ, laddr=0x3000, length=700, raddr=0x8000, rkey=0x42))
    req.post(WorkRequest(0, 6, WrOpcode.SEND, inline=b"x"))
    rd, snd = drain(req)
    assert (rd.opcode, rd.psn, rd.ackreq, rd.length, rd.reth) == (
        Opcode.READ_REQUEST, 10, True, 0, Reth(0x8000, 0x42, 700))
    assert snd.psn == 13 and req.npsn == 14             # the READ took 3 PSNs
    out = resp.receive(rd)
    assert out == [ReadResponse(10, 0x8000, 0x42, 700, 1)]  # no ACK: the response is the ACK
    assert (resp.epsn, resp.msn) == (13, 1)
    rsp = read_response_packets(out[0], 256, remote)
    assert summary(rsp) == [(Opcode.READ_RESP_FIRST, 10, False, 256),
                            (Opcode.READ_RESP_MIDDLE, 11, False, 256),
                            (Opcode.READ_RESP_LAST, 12, False, 188)]
    assert [p.aeth for p in rsp] == [(ACK, 1), None, (ACK, 1)]
    got = []
    for p in rsp:
        got += req.receive(p)
    data = pattern(700, 3)
    assert got == [MemWrite(0x3000, data[:256], 0), MemWrite(0x3100, data[256:512], 256),
                   MemWrite(0x3200, data[512:], 512),
                   Completion(0, 5, S, WcOpcode.RDMA_READ, byte_len=700)]
    assert req.una == 13
    assert summary(read_response_packets(ReadResponse(3, 0, 0, 0, 9), 256)) == [
        (Opcode.READ_RESP_ONLY, 3, False, 0)]


def test_requester_ackreq_window_and_ack_every():
    req, _ = req_and_mem(sq_psn=2, window=4, ack_every=4)
    req.post(WorkRequest(0, 1, WrOpcode.RDMA_WRITE, laddr=0x1000, length=10 * 256, raddr=0))
    pkts = drain(req)
    # PSN 3 (3 % 4 == 3) asks for an ACK; PSN 5 fills the window.
    assert [(p.psn, p.ackreq) for p in pkts] == [(2, False), (3, True), (4, False), (5, True)]
    assert req.next_packet() is None and req.outstanding == 4
    assert req.receive(Ack(3, ACK, 0).packet()) == []
    assert req.una == 4
    assert [(p.psn, p.ackreq) for p in drain(req)] == [(6, False), (7, True)]


def test_unsignaled_wr_completes_silently():
    req, _ = req_and_mem()
    req.post(WorkRequest(0, 1, WrOpcode.SEND, inline=b"a", signaled=False))
    req.post(WorkRequest(0, 2, WrOpcode.SEND, inline=b"b"))
    drain(req)
    assert req.receive(Ack(1, ACK, 2).packet()) == [Completion(0, 2, S, WcOpcode.SEND, byte_len=1)]
    assert req.idle


# --- loss, duplicates, go-back-N -----------------------------------------------------------------

def test_lost_packet_nak_then_go_back_n():
    req, smem = req_and_mem(window=16, retry_cnt=3)
    resp = ResponderModel(pmtu=1, ack_coalesce=100)
    rr = RecvRequest(0, 1, 0x9000, 1024)
    resp.post_recv(rr)
    req.post(WorkRequest(0, 1, WrOpcode.SEND, laddr=0x1000, length=1024))
    p0, p1, p2, p3 = drain(req)
    dst = SparseMemory()
    apply_writes(resp.receive(p0), dst)
    assert resp.receive(p2) == [Ack(1, NAK_SEQ, 0)]         # p1 lost: one NAK with epsn
    assert resp.nak_sent and resp.epsn == 1
    assert resp.receive(p3) == []                           # then silence
    assert req.receive(resp_pkt := Ack(1, NAK_SEQ, 0).packet()) == []
    assert (req.una, req.npsn, req.retry_left) == (1, 1, 2)   # implicit ACK of 0, go back to 1
    again = drain(req)
    assert summary(again) == [(Opcode.SEND_MIDDLE, 1, False, 256), (Opcode.SEND_MIDDLE, 2, False, 256),
                              (Opcode.SEND_LAST, 3, True, 256)]
    assert req.counts["resent"] == 3
    outs = []
    for p in again:
        outs += resp.receive(p)
    apply_writes(outs, dst)
    assert outs[-2:] == [Completion(0, 1, S, WcOpcode.RECV, byte_len=1024, is_recv=True),
                         Ack(3, ACK, 1)]
    assert not resp.nak_sent
    assert dst.read(0x9000, 1024) == pattern(4096)[:1024]
    assert set(dst.write_map().values()) == {1} and len(dst.write_map()) == 1024
    assert req.receive(Ack(3, ACK, 1).packet()) == [Completion(0, 1, S, WcOpcode.SEND, byte_len=1024)]
    assert req.retry_left == 3
    # The stale NAK arriving again is a ghost now.
    assert req.receive(resp_pkt) == [] and req.counts["ghost"] == 1

    # Duplicates: re-ACKed when they ask for it, never executed again.
    assert resp.receive(p2) == []
    assert resp.receive(p3) == [Ack(3, ACK, 1)]
    assert (resp.epsn, resp.msn, resp.in_msg) == (4, 1, InMsg.NONE)


def test_duplicate_read_is_executed_again():
    resp = ResponderModel(pmtu=1, epsn=10)
    rd = Packet(Opcode.READ_REQUEST, 10, True, reth=Reth(0x8000, 0x42, 700))
    assert resp.receive(rd) == [ReadResponse(10, 0x8000, 0x42, 700, 1)]
    assert resp.receive(write_only(13, ackreq=True)) == [MemWrite(0x5000, pattern(16)), Ack(13, ACK, 2)]
    # The same request again: answered again, with today's MSN, nothing else changes.
    assert resp.receive(rd) == [ReadResponse(10, 0x8000, 0x42, 700, 2)]
    # A re-request for the rest (after a lost response) gets its own FIRST..LAST.
    rest = Packet(Opcode.READ_REQUEST, 11, True, reth=Reth(0x8100, 0x42, 444))
    out = resp.receive(rest)
    assert out == [ReadResponse(11, 0x8100, 0x42, 444, 2)]
    assert summary(read_response_packets(out[0], 256)) == [(Opcode.READ_RESP_FIRST, 11, False, 256),
                                                           (Opcode.READ_RESP_LAST, 12, False, 188)]
    assert resp.receive(rd, mr_ok=False) == []               # a duplicate failing its MR check
    assert (resp.epsn, resp.msn, resp.nak_sent) == (14, 2, False)


def test_read_response_lost_timeout_asks_for_the_rest():
    local = SparseMemory()
    req = RequesterModel(pmtu=1, sq_psn=10, mem=local, timeout=1, retry_cnt=3)
    req.post(WorkRequest(0, 5, WrOpcode.RDMA_READ, laddr=0x3000, length=700, raddr=0x8000, rkey=0x42))
    drain(req)
    remote = SparseMemory()
    remote.load(0x8000, pattern(700, 3))
    first = read_response_packets(ReadResponse(10, 0x8000, 0x42, 700, 1), 256, remote)
    apply_writes(req.receive(first[0]), local)
    assert req.una == 11
    # MIDDLE lost, LAST arrives: not una, dropped.
    assert req.receive(first[2]) == [] and req.una == 11
    assert req.timer_armed and req.timer_us == pytest.approx(8.192)
    assert req.timeout() == []
    assert req.retry_left == 2 and req.npsn == 11
    (rd,) = drain(req)
    assert (rd.opcode, rd.psn, rd.reth) == (Opcode.READ_REQUEST, 11, Reth(0x8100, 0x42, 444))
    # The old MIDDLE shows up late: the new request's responses start with FIRST, so it is dropped.
    assert req.receive(first[1]) == [] and req.counts["read_resp_dropped"] == 2
    again = read_response_packets(ReadResponse(11, 0x8100, 0x42, 444, 1), 256, remote)
    got = req.receive(again[0]) + req.receive(again[1])
    apply_writes(got, local)
    assert got[-1] == Completion(0, 5, S, WcOpcode.RDMA_READ, byte_len=700)
    assert local.read(0x3000, 700) == pattern(700, 3)
    assert set(local.write_map().values()) == {1}


def test_ack_past_unfinished_read_goes_back():
    req, _ = req_and_mem(retry_cnt=5)
    req.post(WorkRequest(0, 1, WrOpcode.RDMA_READ, laddr=0x3000, length=300, raddr=0x8000))
    req.post(WorkRequest(0, 2, WrOpcode.SEND, inline=b"z"))
    assert [p.psn for p in drain(req)] == [0, 2]
    # The SEND's ACK arrives, the READ's responses never did: ask for the READ again.
    assert req.receive(Ack(2, ACK, 2).packet()) == []
    assert (req.una, req.npsn, req.retry_left) == (0, 0, 5)
    assert summary(drain(req)) == [(Opcode.READ_REQUEST, 0, True, 0), (Opcode.SEND_ONLY, 2, True, 1)]
    # A READ response also acknowledges the SEND/WRITE before it.
    req2, _ = req_and_mem()
    req2.post(WorkRequest(0, 1, WrOpcode.SEND, inline=b"z"))
    req2.post(WorkRequest(0, 2, WrOpcode.RDMA_READ, laddr=0x3000, length=4, raddr=0x8000))
    drain(req2)
    rsp = Packet(Opcode.READ_RESP_ONLY, 1, payload=b"abcd", aeth=(ACK, 2))
    assert req2.receive(rsp) == [Completion(0, 1, S, WcOpcode.SEND, byte_len=1),
                                 MemWrite(0x3000, b"abcd"),
                                 Completion(0, 2, S, WcOpcode.RDMA_READ, byte_len=4)]


def test_ghost_acks_ignored():
    req, _ = req_and_mem(sq_psn=50)
    req.post(WorkRequest(0, 1, WrOpcode.SEND, laddr=0x1000, length=600))
    drain(req)                                           # PSNs 50..52
    for psn, syn in ((49, ACK), (53, ACK), (53, NAK_SEQ), (40, NAK_INV), (0x800032, ACK)):
        assert req.receive(Ack(psn, syn, 0).packet()) == []
    assert (req.una, req.npsn, req.error, req.counts["ghost"]) == (50, 53, False, 5)
    assert req.receive(Ack(51, ACK, 0).packet()) == [] and req.una == 52


# --- RNR, retries, errors ------------------------------------------------------------------------

def test_rnr_then_success():
    req, _ = req_and_mem(rnr_retry=7)
    resp = ResponderModel(pmtu=1, min_rnr_timer=14)
    req.post(WorkRequest(0, 1, WrOpcode.SEND, inline=b"hi"))
    for _ in range(10):                                   # rnr_retry 7: forever
        (p,) = drain(req)
        assert resp.receive(p) == [Ack(0, 0x2E, 0)] and resp.nak_sent
        assert req.receive(Ack(0, 0x2E, 0).packet()) == []
        assert req.rnr_wait and req.timer_kind == "rnr" and req.timer_us == 1280
        assert req.next_packet() is None and req.timeout() == []   # the ACK timer is not running
        assert req.rnr_left == 7
        req.rnr_expired()
        assert not req.rnr_wait
    rr = RecvRequest(0, 4, 0x100, 8)
    resp.post_recv(rr)
    (p,) = drain(req)
    out = resp.receive(p)
    assert out[1:] == [Completion(0, 4, S, WcOpcode.RECV, byte_len=2, is_recv=True), Ack(0, ACK, 1)]
    assert req.receive(out[-1].packet()) == [Completion(0, 1, S, WcOpcode.SEND, byte_len=2)]
    # WRITE with immediate needs a receive WQE too, at its last packet.
    assert resp.receive(Packet(Opcode.WRITE_ONLY_IMM, 1, True, reth=Reth(0, 0, 0), imm=5)) == [
        Ack(1, 0x2E, 1)]


def test_rnr_retry_exhausted():
    req, _ = req_and_mem(rnr_retry=2)
    req.post(WorkRequest(0, 1, WrOpcode.SEND, inline=b"hi", signaled=False))
    req.post(WorkRequest(0, 2, WrOpcode.RDMA_WRITE, inline=b"w"))
    for left in (1, 0):
        drain(req)
        assert req.receive(Ack(0, rnr_syndrome(1), 0).packet()) == []
        assert req.rnr_left == left and req.timer_us == 10
        req.rnr_expired()
    drain(req)
    out = req.receive(Ack(0, rnr_syndrome(1), 0).packet())
    assert [(c.wr_id, c.status) for c in out] == [(1, WcStatus.RNR_RETRY_EXC_ERR),
                                                 (2, WcStatus.WR_FLUSH_ERR)]
    assert req.error and req.next_packet() is None and not req.timer_armed
    assert req.post(WorkRequest(0, 3, WrOpcode.SEND, inline=b"")) == [
        Completion(0, 3, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND)]


def test_retry_exhausted_by_timeouts_and_naks():
    req, _ = req_and_mem(retry_cnt=2, timeout=3)
    assert req.timeout() == []                               # not armed: nothing
    req.post(WorkRequest(0, 1, WrOpcode.RDMA_WRITE, inline=b"w"))
    for left in (1, 0):
        (p,) = drain(req)
        assert req.timer_armed and req.timer_us == pytest.approx(32.768)
        assert req.timeout() == [] and req.retry_left == left and not req.timer_armed
    (p,) = drain(req)
    assert req.counts["resent"] == 2
    assert [(c.wr_id, c.status) for c in req.timeout()] == [(1, WcStatus.RETRY_EXC_ERR)]
    # A PSN sequence NAK costs a retry as well.
    req, _ = req_and_mem(retry_cnt=0)
    req.post(WorkRequest(0, 1, WrOpcode.RDMA_WRITE, inline=b"w"))
    drain(req)
    assert [(c.wr_id, c.status) for c in req.receive(Ack(0, NAK_SEQ, 0).packet())] == [
        (1, WcStatus.RETRY_EXC_ERR)]
    # timeout 0: the timer never runs.
    req, _ = req_and_mem(timeout=0)
    req.post(WorkRequest(0, 1, WrOpcode.RDMA_WRITE, inline=b"w"))
    drain(req)
    assert not req.timer_armed and req.timeout() == []


@pytest.mark.parametrize("syndrome, status", [(NAK_INV, WcStatus.REM_INV_REQ_ERR),
                                              (NAK_ACCESS, WcStatus.REM_ACCESS_ERR),
                                              (0x63, WcStatus.REM_OP_ERR)])
def test_fatal_naks(syndrome, status):
    req, _ = req_and_mem()
    for i in range(3):
        req.post(WorkRequest(0, i, WrOpcode.RDMA_WRITE, laddr=0x1000, length=300, raddr=0x5000))
    drain(req)                                            # PSNs 0-1, 2-3, 4-5
    out = req.receive(Ack(3, syndrome, 1).packet())       # second packet of the second WR
    assert [(c.wr_id, c.status) for c in out] == [(0, S), (1, status), (2, WcStatus.WR_FLUSH_ERR)]
    assert req.error and req.idle


@pytest.mark.parametrize("setup, pkt", [
    ([], Packet(Opcode.SEND_MIDDLE, 5, payload=bytes(256))),
    ([], Packet(Opcode.SEND_LAST, 5, payload=bytes(10))),
    ([], Packet(Opcode.WRITE_LAST, 5, payload=bytes(10))),
    ([Packet(Opcode.SEND_FIRST, 5, payload=bytes(256))], Packet(Opcode.WRITE_ONLY, 6, reth=Reth(0, 0, 0))),
    ([Packet(Opcode.SEND_FIRST, 5, payload=bytes(256))], Packet(Opcode.SEND_ONLY, 6)),
    ([Packet(Opcode.SEND_FIRST, 5, payload=bytes(256))],
     Packet(Opcode.READ_REQUEST, 6, reth=Reth(0, 0, 4))),
    ([Packet(Opcode.WRITE_FIRST, 5, payload=bytes(256), reth=Reth(0, 0, 600))],
     Packet(Opcode.SEND_LAST, 6, payload=bytes(4))),
    # payload lengths
    ([], Packet(Opcode.SEND_FIRST, 5, payload=bytes(100))),
    ([Packet(Opcode.SEND_FIRST, 5, payload=bytes(256))], Packet(Opcode.SEND_LAST, 6)),
    ([Packet(Opcode.SEND_FIRST, 5, payload=bytes(256))], Packet(Opcode.SEND_MIDDLE, 6, payload=bytes(255))),
    ([], Packet(Opcode.SEND_ONLY, 5, payload=bytes(257))),
    ([], Packet(Opcode.READ_REQUEST, 5, payload=bytes(4), reth=Reth(0, 0, 4))),
    # WRITE bytes must add up to the DMA length
    ([], Packet(Opcode.WRITE_ONLY, 5, payload=bytes(10), reth=Reth(0, 0, 20))),
    ([], Packet(Opcode.WRITE_FIRST, 5, payload=bytes(256), reth=Reth(0, 0, 256))),
    ([Packet(Opcode.WRITE_FIRST, 5, payload=bytes(256), reth=Reth(0, 0, 300))],
     Packet(Opcode.WRITE_LAST, 6, payload=bytes(40))),
    ([Packet(Opcode.WRITE_FIRST, 5, payload=bytes(256), reth=Reth(0, 0, 300))],
     Packet(Opcode.WRITE_MIDDLE, 6, payload=bytes(256))),
])
def test_invalid_request(setup, pkt):
    resp = ResponderModel(pmtu=1, epsn=5, ack_coalesce=100)
    resp.post_recv(RecvRequest(0, 1, 0, 4096))
    for p in setup:
        assert Ack not in {type(o) for o in resp.receive(p)}
    before = (resp.epsn, resp.msn, resp.in_msg)
    assert resp.receive(pkt) == [Ack(pkt.psn, NAK_INV, resp.msn)]
    assert (resp.epsn, resp.msn, resp.in_msg) == before and resp.nak_sent


def test_remote_access_error():
    resp = ResponderModel(pmtu=1, epsn=5)
    assert resp.receive(write_only(5), mr_ok=False) == [Ack(5, NAK_ACCESS, 0)]
    rd = Packet(Opcode.READ_REQUEST, 5, reth=Reth(0, 7, 8))
    assert resp.receive(rd, mr_ok=lambda p: p.reth.rkey != 7) == [Ack(5, NAK_ACCESS, 0)]
    assert resp.epsn == 5 and resp.nak_sent
    assert resp.receive(write_only(5), mr_ok=lambda p: p.reth.rkey == 0x99)[0] == MemWrite(
        0x5000, pattern(16))
    assert resp.epsn == 6 and not resp.nak_sent


def test_receive_buffer_too_small():
    resp = ResponderModel(pmtu=1, ack_coalesce=100)
    small = RecvRequest(0, 1, 0x100, 300)
    resp.post_recv(small)
    resp.post_recv(RecvRequest(0, 2, 0x800, 300))
    assert resp.receive(Packet(Opcode.SEND_FIRST, 0, payload=bytes(256)))[0].recv == small
    assert resp.receive(Packet(Opcode.SEND_MIDDLE, 1, payload=bytes(256))) == [
        Completion(0, 1, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, is_recv=True), Ack(1, NAK_INV, 0)]
    assert resp.epsn == 1 and resp.nak_sent
    # The WQE is gone: the rest of the message has nowhere to go.
    assert resp.receive(Packet(Opcode.SEND_LAST, 1, payload=bytes(4))) == [Ack(1, NAK_INV, 0)]
    resp2 = ResponderModel(pmtu=1)
    resp2.post_recv(RecvRequest(0, 3, 0x100, 10))
    assert resp2.receive(Packet(Opcode.SEND_ONLY_INV, 0, payload=bytes(11), ieth=5)) == [
        Completion(0, 3, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, is_recv=True), Ack(0, NAK_INV, 0)]
    assert not resp2.rq


def test_qp_state_gates_the_responder():
    resp = ResponderModel(pmtu=1, state=QpState.INIT)
    assert resp.receive(write_only(0, ackreq=True)) == [] and resp.epsn == 0
    resp.state = QpState.RTR
    assert resp.receive(write_only(0, ackreq=True))[-1] == Ack(0, ACK, 1)
    resp.state = QpState.ERROR
    assert resp.receive(write_only(1, ackreq=True)) == [] and resp.epsn == 1


# --- PSN wrap and ACK coalescing -----------------------------------------------------------------

def test_psn_wrap():
    req, _ = req_and_mem(sq_psn=0xFFFFFE)
    resp = ResponderModel(pmtu=1, epsn=0xFFFFFE, ack_coalesce=100)
    resp.post_recv(RecvRequest(0, 1, 0, 1024))
    req.post(WorkRequest(0, 1, WrOpcode.SEND, laddr=0x1000, length=1000))
    pkts = drain(req)
    assert [p.psn for p in pkts] == [0xFFFFFE, 0xFFFFFF, 0, 1] and req.npsn == 2
    outs = [resp.receive(p) for p in pkts]
    assert outs[-1][-1] == Ack(1, ACK, 1) and resp.epsn == 2
    assert req.receive(Ack(0xFFFFFF, ACK, 0).packet()) == [] and req.una == 0
    assert req.receive(Ack(1, ACK, 1).packet())[0].wr_id == 1 and req.una == 2
    # Duplicate / out-of-sequence decisions across the wrap (epsn is 2 now).
    assert resp.receive(Packet(Opcode.SEND_ONLY, 0xFFFFFF, True)) == [Ack(1, ACK, 1)]
    assert resp.receive(Packet(Opcode.SEND_ONLY, 0x800002, True)) == [Ack(1, ACK, 1)]   # behind
    assert resp.receive(Packet(Opcode.SEND_ONLY, 0x800001, True)) == [Ack(2, NAK_SEQ, 1)]  # ahead


def test_ack_coalescing_counts():
    resp = ResponderModel(pmtu=1, ack_coalesce=3)
    acks = []
    for psn in range(7):
        acks += [o.psn for o in resp.receive(write_only(psn)) if isinstance(o, Ack)]
    assert acks == [2, 5] and resp.ack_count == 1
    assert resp.receive(write_only(7, ackreq=True))[-1] == Ack(7, ACK, 8)      # AckReq: at once
    assert resp.ack_count == 0
    # A READ request neither counts nor is acknowledged; a NAK restarts the count.
    assert resp.receive(Packet(Opcode.READ_REQUEST, 8, reth=Reth(0, 0, 4)))[0].psn == 8
    assert resp.receive(write_only(9))[-1] == MemWrite(0x5000, pattern(16))
    assert resp.ack_count == 1
    assert resp.receive(write_only(20)) == [Ack(10, NAK_SEQ, 10)] and resp.ack_count == 0
    out = [resp.receive(write_only(psn)) for psn in (10, 11, 12)]
    assert [o[-1] for o in out] == [MemWrite(0x5000, pattern(16))] * 2 + [Ack(12, ACK, 13)]
    # 0 or 1: every packet.
    for n in (0, 1):
        r = ResponderModel(pmtu=1, ack_coalesce=n)
        assert [r.receive(write_only(p))[-1] for p in range(2)] == [Ack(0, ACK, 1), Ack(1, ACK, 2)]


# --- end to end ----------------------------------------------------------------------------------

BUF = 0x400         # every buffer slot: up to 3 packets of 256 B plus slack


def random_run(seed, loss, n_wr=120, planted=None):
    """Two model NICs, two connections, traffic both ways: random opcodes, lengths (0, MTU
    boundaries, up to 4 packets), inline, unsignaled WRs, receive WQEs posted late (RNR), PSNs
    starting near the wrap. Returns the PairSim and the Scoreboard after check()."""
    rng = random.Random(f"rcmodel-e2e:{seed}:{loss}")
    print(f"rcmodel e2e: seed {seed} loss {loss} (replay with STELLAR_SEED={seed})")
    mems = {s: SparseMemory() for s in "ab"}
    for i, s in enumerate("ab"):
        mems[s].load(0, pattern(0x10000, 17 * i + 5))        # sources
        mems[s].load(0x10000, bytes(rng.getrandbits(8) for _ in range(0x10000)))    # targets
    sim = PairSim(mems, rng=rng, loss=loss, pmtu=1, window=rng.choice([4, 8, 32]),
                  ack_every=rng.choice([0, 3]), ack_coalesce=rng.choice([1, 4]), retry_cnt=7,
                  rnr_retry=7, timeout=4, min_rnr_timer=2)
    sb = Scoreboard(mems["a"], mems["b"])
    links = [(1, 2), (3, 4)]
    for qa, qb in links:
        sim.connect(qa, qb, psn_ab=rng.choice([0xFFFFF0, rng.randrange(1 << 24)]),
                    psn_ba=rng.randrange(1 << 24))
        sb.connect(qa, qb)
    for s in "ab":
        sb.watch(s, 0x10000, 0x10000)
    sb.snapshot()
    if planted:
        planted(sim)
    slot = {s: 0 for s in "ab"}                                # next free target slot per side
    recv_at = {}

    def target(side):
        a = 0x10000 + slot[side] * BUF
        slot[side] += 1
        return a

    for k in range(n_wr):
        side = rng.choice("ab")
        peer = "b" if side == "a" else "a"
        qp, pqp = rng.choice(links) if side == "a" else rng.choice(links)[::-1]
        op = rng.choice(list(WrOpcode))
        length = rng.choice([0, 1, 255, 256, 257, 512, 700, 1024, rng.randrange(1, 1025)])
        wr = WorkRequest(qp, k, op, laddr=rng.randrange(0, 0x10000 - length), length=length,
                         imm=rng.getrandbits(32), invalidate_rkey=rng.getrandbits(32),
                         signaled=rng.random() < 0.7 or k == n_wr - 1)
        if op.is_write:
            wr.raddr = target(peer)
        if op.is_read:
            wr.laddr, wr.raddr = target(side), rng.randrange(0, 0x10000 - length)
        elif rng.random() < 0.15 and length <= 32:
            wr.inline = pattern(length, k)
        if op.consumes_recv:
            addr = target(peer)
            rr = RecvRequest(pqp, 1000 + k, addr, rng.choice([length, BUF]))
            t = max(recv_at.get((peer, pqp), 0.0), rng.uniform(0, 150))   # keep posting order
            recv_at[peer, pqp] = t
            sim.post_recv(peer, rr, at_us=t)
            sb.post_recv(peer, rr)
        sim.post_send(side, wr)
        sb.post_send(side, wr)
    sim.run(until_us=1e6)
    assert sim.idle, "the model pair did not finish"
    for side, c in sim.completions:
        sb.completion(side, c)
    sb.check()
    return sim, sb


@pytest.mark.parametrize("loss", [0.0, 0.01, 0.05])
@pytest.mark.parametrize("seed", seeds([1, 2]))
def test_end_to_end_lossy(seed, loss):
    sim, sb = random_run(seed, loss)
    rep = sb.report()
    print(rep, {k: dict(r.counts) for k, r in sim.req.items()})
    assert rep["problems"] == 0 and rep["error_completions"] == 0
    assert rep["send_wrs"] == 120 and rep["bytes_checked"] > 0x20000
    wire = sum((w.counts for w in sim.wire.values()), start=type(sim.wire["a"].counts)())
    resent = sum(r.counts["resent"] for r in sim.req.values())
    rnr = sum(r.counts["rnr_nak"] for r in sim.req.values())
    assert rnr > 0                                          # late receive WQEs were exercised
    if loss == 0:
        assert wire["dropped"] == wire["duplicated"] == wire["delayed"] == 0
    else:
        assert wire["dropped"] > 0 and resent > 0
        if loss >= 0.05:
            assert wire["duplicated"] > 0 and wire["delayed"] > 0
            assert sum(r.counts["timeout"] + r.counts["nak_seq"] for r in sim.req.values()) > 0


def test_end_to_end_catches_a_responder_without_psn_check():
    """Planted bug: the responder takes a packet ahead of epsn as if it were the expected one.
    The end-to-end run must fail on the scoreboard."""
    def planted(sim):
        for r in sim.resp.values():
            def sloppy(pkt, r=r):
                r._epsn = pkt.psn
                return r._expected(pkt, Opcode(pkt.opcode), True)
            r._ahead = sloppy
    with pytest.raises(AssertionError, match="scoreboard"):
        random_run(3, 0.05, planted=planted)


@pytest.mark.parametrize("case", ["rem_access", "recv_too_small", "rnr_exhausted", "retry_exhausted"])
def test_end_to_end_errors(case):
    """Fatal errors in a lossy run: the failing WR completes with its status, the WRs after it
    (posted before or after the failure) with WR_FLUSH_ERR; the scoreboard, told which status to
    expect, accepts the run."""
    rng = random.Random(f"rcmodel-e2e-errors:{case}")
    mems = {s: SparseMemory() for s in "ab"}
    for s in "ab":
        mems[s].load(0, pattern(0x8000, ord(s)))
    loss = 1.0 if case == "retry_exhausted" else 0.02
    sim = PairSim(mems, rng=rng, loss=loss, pmtu=1, window=8, timeout=2, retry_cnt=3,
                  rnr_retry=1 if case == "rnr_exhausted" else 7,
                  mr_ok=lambda p: p.reth.rkey != 0xBAD)
    sb = Scoreboard(mems["a"], mems["b"])
    sim.connect(1, 2, psn_ab=0xFFFFFD)
    sb.connect(1, 2)
    for s in "ab":
        sb.watch(s, 0, 0x8000)
    sb.snapshot()

    def post(wr, recv_len=None):
        if recv_len is not None:
            rr = RecvRequest(2, 100 + wr.wr_id, 0x6000 + wr.wr_id * 0x100, recv_len)
            sim.post_recv("b", rr)
            sb.post_recv("b", rr)
        sim.post_send("a", wr)
        sb.post_send("a", wr)

    good = case != "retry_exhausted"
    if good:
        post(WorkRequest(1, 1, WrOpcode.RDMA_WRITE, laddr=0x100, length=600, raddr=0x4000))
        post(WorkRequest(1, 2, WrOpcode.SEND, laddr=0x200, length=200), recv_len=256)
    if case == "rem_access":
        post(WorkRequest(1, 3, WrOpcode.RDMA_WRITE, laddr=0x300, length=700, raddr=0x4400, rkey=0xBAD))
        status = WcStatus.REM_ACCESS_ERR
    elif case == "recv_too_small":
        post(WorkRequest(1, 3, WrOpcode.SEND, laddr=0x300, length=700), recv_len=0x100)
        status = WcStatus.REM_INV_REQ_ERR
    elif case == "rnr_exhausted":
        post(WorkRequest(1, 3, WrOpcode.SEND_WITH_IMM, laddr=0x300, length=20, imm=3))
        status = WcStatus.RNR_RETRY_EXC_ERR
    else:
        post(WorkRequest(1, 3, WrOpcode.RDMA_WRITE, laddr=0x300, length=700, raddr=0x4400))
        status = WcStatus.RETRY_EXC_ERR
    post(WorkRequest(1, 4, WrOpcode.RDMA_READ, laddr=0x5000, length=300, raddr=0x100))
    post(WorkRequest(1, 5, WrOpcode.RDMA_WRITE, inline=b"after", raddr=0x4900, signaled=False))
    sb.expect_error("a", 1, status)
    sim.run(until_us=1e6)
    assert sim.req["a", 1].error
    post(WorkRequest(1, 6, WrOpcode.RDMA_WRITE, inline=b"late", raddr=0x4800))   # flushed at once
    for side, c in sim.completions:
        sb.completion(side, c)
    sb.check()
    sends = [(c.wr_id, c.status) for s, c in sim.completions if s == "a"]
    ok = [(1, S), (2, S)] if good else []
    assert sends == ok + [(3, status), (4, WcStatus.WR_FLUSH_ERR), (5, WcStatus.WR_FLUSH_ERR),
                          (6, WcStatus.WR_FLUSH_ERR)]
    recvs = [(c.wr_id, c.status) for s, c in sim.completions if s == "b"]
    assert recvs[:1] == ([(102, S)] if good else [])
    if case == "recv_too_small":
        assert recvs[1:] == [(103, WcStatus.LOC_LEN_ERR)]
