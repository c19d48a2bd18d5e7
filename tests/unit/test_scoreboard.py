"""stellar.sim.scoreboard: accepts a correct run, catches each planted defect with a message that
names the WR and the byte.

The correct runs come from an ideal pair of NICs written here (each WR executed at once:
memory written, completions produced), independent of the transport model; the defects are
planted into its memories and completion lists. The scoreboard also accepts what the RC model
pair does over a lossy channel (tests/unit/test_rcmodel.py).
"""

from collections import defaultdict, deque

import pytest
from stellar.sim.scoreboard import HostMemory, Scoreboard, SparseMemory
from stellar.sim.verbs import Completion, RecvRequest, WcOpcode, WcStatus, WorkRequest, WrOpcode

S = WcStatus.SUCCESS
W = WrOpcode


def pattern(n, salt=0):
    return bytes((i * 11 + salt) & 0xFF for i in range(n))


class DenseMemory:
    """A bytearray with a dense list of write counts (the other shape a write map may take)."""

    def __init__(self, size):
        self.data = bytearray(size)
        self.counts = [0] * size

    def load(self, addr, data):
        self.data[addr:addr + len(data)] = data

    def write(self, addr, data):
        self.data[addr:addr + len(data)] = data
        for a in range(addr, addr + len(data)):
            self.counts[a] += 1

    def read(self, addr, n):
        return bytes(self.data[addr:addr + n])

    def write_map(self):
        return self.counts


class Ideal:
    """Two perfect NICs: every WR executes when posted. Completions are held back in ``cqes``
    (side, Completion) until ``finish`` hands them to the scoreboard, so tests can tamper."""

    def __init__(self, mem_cls=SparseMemory, links=((1, 2), (3, 4)), translate=None):
        self.mems = {"a": mem_cls(), "b": mem_cls()} if mem_cls is SparseMemory else \
            {"a": mem_cls(0x40000), "b": mem_cls(0x40000)}
        for i, s in enumerate("ab"):
            self.mems[s].load(0, pattern(0x10000, 3 + i))
            self.mems[s].load(0x10000, pattern(0x10000, 101 + i))
        self.sb = Scoreboard(self.mems["a"], self.mems["b"], translate=translate)
        self.peer = {}
        for qa, qb in links:
            self.sb.connect(qa, qb)
            self.peer["a", qa], self.peer["b", qb] = ("b", qb), ("a", qa)
        for s in "ab":
            self.sb.watch(s, 0x10000, 0x10000)
        self.sb.snapshot()
        self.rq = defaultdict(deque)
        self.cqes = []
        self.va_offset = 0          # remote va = bus address + va_offset (see translate tests)

    def post_recv(self, side, qp, wr_id, addr, length):
        rr = RecvRequest(qp, wr_id, addr, length)
        self.sb.post_recv(side, rr)
        self.rq[side, qp].append(rr)

    def post_send(self, side, wr, execute=True):
        self.sb.post_send(side, wr)
        if not execute:
            return
        pside, pqp = self.peer[side, wr.qp]
        mem, pmem = self.mems[side], self.mems[pside]
        data = wr.inline if wr.inline is not None else mem.read(wr.laddr, wr.length)
        if wr.opcode.is_write:
            pmem.write(wr.raddr - self.va_offset, data)
        if wr.opcode.is_read:
            mem.write(wr.laddr, pmem.read(wr.raddr - self.va_offset, wr.length))
        if wr.opcode.consumes_recv:
            r = self.rq[pside, pqp].popleft()
            if wr.opcode.is_send:
                pmem.write(r.addr, data)
            self.cqes.append((pside, Completion(
                pqp, r.wr_id, S, WcOpcode.RECV if wr.opcode.is_send else WcOpcode.RECV_RDMA_WITH_IMM,
                byte_len=wr.size, imm=wr.imm if wr.opcode.has_imm else None,
                invalidated_rkey=wr.invalidate_rkey if wr.opcode is W.SEND_WITH_INV else None,
                is_recv=True)))
        if wr.signaled:
            op = {W.RDMA_READ: WcOpcode.RDMA_READ, W.RDMA_WRITE: WcOpcode.RDMA_WRITE,
                  W.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE}.get(wr.opcode, WcOpcode.SEND)
            self.cqes.append((side, Completion(wr.qp, wr.wr_id, S, op, byte_len=wr.size)))

    def finish(self):
        for side, c in self.cqes:
            self.sb.completion(side, c)
        return self.sb


def standard(mem_cls=SparseMemory):
    """Every opcode, both directions, two connections, overlapping targets."""
    run = Ideal(mem_cls)
    run.post_recv("b", 2, 100, 0x14000, 512)
    run.post_recv("b", 2, 101, 0x14400, 64)
    run.post_recv("b", 2, 102, 0x14800, 64)
    run.post_recv("b", 2, 103, 0x14C00, 64)
    run.post_recv("a", 1, 200, 0x18000, 1000)
    run.post_send("a", WorkRequest(1, 1, W.RDMA_WRITE, laddr=0x100, length=600, raddr=0x11000))
    run.post_send("a", WorkRequest(1, 2, W.SEND_WITH_IMM, laddr=0x2000, length=300, imm=0xBEEF))
    run.post_send("a", WorkRequest(1, 3, W.RDMA_READ, laddr=0x12000, length=500, raddr=0x3000))
    run.post_send("a", WorkRequest(1, 4, W.RDMA_WRITE_WITH_IMM, inline=b"0123456789",
                                   raddr=0x11800, imm=7))
    run.post_send("a", WorkRequest(1, 5, W.SEND_WITH_INV, length=0, invalidate_rkey=0x1234,
                                   signaled=False))
    run.post_send("a", WorkRequest(1, 6, W.SEND, inline=b"last", signaled=True))
    # Same QP writes the same bytes twice (count 2, the later wins); another QP overlaps too.
    run.post_send("a", WorkRequest(1, 7, W.RDMA_WRITE, laddr=0x5000, length=100, raddr=0x11000))
    run.post_send("a", WorkRequest(3, 8, W.RDMA_WRITE, laddr=0x6000, length=50, raddr=0x11010))
    run.post_send("b", WorkRequest(2, 9, W.SEND, laddr=0x700, length=900))
    run.post_send("b", WorkRequest(4, 10, W.RDMA_READ, laddr=0x13000, length=256, raddr=0x100))
    return run


@pytest.mark.parametrize("mem_cls", [SparseMemory, DenseMemory])
def test_correct_run_passes(mem_cls):
    run = standard(mem_cls)
    assert isinstance(run.mems["a"], HostMemory)
    sb = run.finish()
    sb.check()
    rep = sb.report()
    print(rep)
    assert rep["problems"] == 0 and rep["send_wrs"] == 10 and rep["recv_wrs"] == 5
    assert rep["completions"] == 9 + 5 and rep["bytes_checked"] > 0x20000


def check_fails(sb, *fragments):
    with pytest.raises(AssertionError) as e:
        sb.check()
    msg = str(e.value)
    print(msg)
    for f in fragments:
        assert f in msg, f"{f!r} not in:\n{msg}"
    return msg


# --- memory defects ------------------------------------------------------------------------------

def test_byte_written_twice():
    run = standard()
    b = run.mems["b"]
    b.write(0x11100, b.read(0x11100, 1))            # same value again: only the count is wrong
    check_fails(run.finish(), "RDMA_WRITE wr_id 0x1 (600 B) of a qp 1",
                "byte 0x11100 (offset 256) written 2 times, expected 1")


def test_overlapping_target_written_once_too_few():
    run = Ideal()
    run.post_send("a", WorkRequest(1, 1, W.RDMA_WRITE, laddr=0x100, length=8, raddr=0x11000))
    run.sb.post_send("a", WorkRequest(1, 2, W.RDMA_WRITE, laddr=0x200, length=8, raddr=0x11000))
    run.cqes.append(("a", Completion(1, 2, S, WcOpcode.RDMA_WRITE)))
    # The second WRITE "completed" but never landed: value and count both betray it.
    check_fails(run.finish(), "written 1 times, expected 2", "wr_id 0x2")


def test_byte_outside_target_written():
    run = standard()
    run.mems["b"].write(0x11000 + 600, b"\xAA")     # one past the first WRITE's target
    check_fails(run.finish(), "b memory, watched region 0x10000+0x10000: byte 0x11258 outside "
                "every target was written 1 times")


def test_byte_outside_target_changed_without_a_counted_write():
    run = standard()
    run.mems["a"].load(0x1FFFF, b"\x00")
    check_fails(run.finish(), "byte 0x1ffff outside every target was written 0 times")


def test_send_overflowing_its_buffer_is_caught():
    run = standard()
    run.mems["b"].write(0x14000 + 300, b"\x01\x02")  # two bytes after SEND wr 2's 300 B
    check_fails(run.finish(), "byte 0x1412c outside every target")


@pytest.mark.parametrize("where, addr, name", [
    ("b", 0x11000 + 200, "RDMA_WRITE wr_id 0x1"),
    ("b", 0x14000 + 17, "SEND_WITH_IMM wr_id 0x2"),
    ("a", 0x12000 + 499, "RDMA_READ wr_id 0x3"),
    ("a", 0x18000 + 5, "SEND wr_id 0x9"),
])
def test_wrong_data(where, addr, name):
    run = standard()
    m = run.mems[where]
    m.load(addr, bytes([m.read(addr, 1)[0] ^ 0x40]))
    check_fails(run.finish(), name, f"byte {addr:#x}", "expected")


def test_read_source_captured_at_post_time():
    run = Ideal()
    run.post_send("a", WorkRequest(1, 1, W.RDMA_READ, laddr=0x12000, length=16, raddr=0x3000))
    run.mems["b"].load(0x3000, b"\xFF" * 16)        # source changes after the READ: no effect
    run.finish().check()


def test_overlap_from_two_qps_accepts_either_order_but_not_garbage():
    run = Ideal()
    run.post_send("a", WorkRequest(1, 1, W.RDMA_WRITE, laddr=0x100, length=8, raddr=0x11000))
    run.post_send("a", WorkRequest(3, 2, W.RDMA_WRITE, laddr=0x200, length=8, raddr=0x11000))
    run.mems["b"].load(0x11000, run.mems["a"].read(0x100, 4))   # wr 1 landed last for 4 bytes
    run.finish().check()
    run2 = Ideal()
    run2.post_send("a", WorkRequest(1, 1, W.RDMA_WRITE, laddr=0x100, length=8, raddr=0x11000))
    run2.post_send("a", WorkRequest(3, 2, W.RDMA_WRITE, laddr=0x200, length=8, raddr=0x11000))
    run2.mems["b"].load(0x11003, b"\x00")
    check_fails(run2.finish(), "byte 0x11003 (offset 3) is 0x00, expected")


# --- completion defects --------------------------------------------------------------------------

def test_missing_completion():
    run = standard()
    del run.cqes[next(i for i, (s, c) in enumerate(run.cqes) if c.wr_id == 3 and s == "a")]
    check_fails(run.finish(), "a qp 1: missing send completion for RDMA_READ wr_id 0x3 (500 B)")


def test_duplicate_completion():
    run = standard()
    run.cqes.append(run.cqes[0])
    run.cqes.append(next(x for x in run.cqes if x[1].is_recv))
    check_fails(run.finish(), "a qp 1: 2 send completions for RDMA_WRITE wr_id 0x1 (600 B) of a qp 1",
                "b qp 2: 2 receive completions for receive WQE wr_id 0x64 (512 B)")


def test_out_of_order_completion():
    run = standard()
    a1 = [i for i, (s, c) in enumerate(run.cqes) if s == "a" and c.qp == 1 and not c.is_recv]
    i, j = a1[1], a1[2]
    run.cqes[i], run.cqes[j] = run.cqes[j], run.cqes[i]
    check_fails(run.finish(), "a qp 1: send completions out of order: "
                "RDMA_READ wr_id 0x3 (500 B) of a qp 1 came before SEND_WITH_IMM wr_id 0x2")


def test_receive_completions_out_of_order():
    run = standard()
    b2 = [i for i, (s, c) in enumerate(run.cqes) if s == "b" and c.is_recv]
    i, j = b2[0], b2[1]
    run.cqes[i], run.cqes[j] = run.cqes[j], run.cqes[i]
    check_fails(run.finish(), "b qp 2: receive completions out of order")


def test_completion_for_unsignaled_wr():
    run = standard()
    run.cqes.append(("a", Completion(1, 5, S, WcOpcode.SEND)))
    check_fails(run.finish(), "unexpected send completion for SEND_WITH_INV wr_id 0x5 (0 B) of a qp 1, "
                "which should not complete")


def test_completion_nobody_asked_for():
    run = standard()
    run.post_recv("b", 2, 104, 0x15000, 64)       # no message consumes this one
    run.cqes.append(("b", Completion(2, 0x77, S, WcOpcode.SEND)))
    run.cqes.append(("b", Completion(9, 1, S, WcOpcode.SEND)))
    run.cqes.append(("b", Completion(2, 104, S, WcOpcode.RECV, is_recv=True)))
    check_fails(run.finish(), "unknown wr_id 0x77", "qp 9, which is not connected",
                "unexpected receive completion for receive WQE wr_id 0x68")


@pytest.mark.parametrize("wr_id, side, change, fragment", [
    (3, "a", dict(byte_len=499), "byte_len 499, expected 500"),
    (3, "a", dict(opcode=WcOpcode.RDMA_WRITE), "opcode RDMA_WRITE, expected RDMA_READ"),
    (2, "a", dict(status=WcStatus.REM_OP_ERR), "unexpected error completion"),
    (101, "b", dict(imm=6), "imm 6, expected 7"),
    (100, "b", dict(byte_len=299), "byte_len 299, expected 300"),
    (102, "b", dict(invalidated_rkey=None), "invalidated_rkey None, expected 4660"),
    (101, "b", dict(opcode=WcOpcode.RECV), "opcode RECV, expected RECV_RDMA_WITH_IMM"),
])
def test_wrong_completion_fields(wr_id, side, change, fragment):
    run = standard()
    i = next(i for i, (s, c) in enumerate(run.cqes) if s == side and c.wr_id == wr_id)
    c = run.cqes[i][1]
    for k, v in change.items():
        setattr(c, k, v)
    check_fails(run.finish(), fragment)


def test_send_byte_len_not_checked():
    run = standard()
    for _, c in run.cqes:
        if not c.is_recv and c.opcode != WcOpcode.RDMA_READ:
            c.byte_len = 0                          # verbs leaves it undefined for SEND/WRITE
    run.finish().check()


def test_send_into_wrong_receive_wqe():
    run = Ideal()
    run.post_recv("b", 2, 100, 0x14000, 64)
    run.post_recv("b", 2, 101, 0x14400, 64)
    run.rq["b", 2].rotate(1)                        # the NIC takes the WQEs in the wrong order
    run.post_send("a", WorkRequest(1, 1, W.SEND, laddr=0x100, length=10))
    check_fails(run.finish(), "unexpected receive completion for receive WQE wr_id 0x65",
                "missing receive completion for receive WQE wr_id 0x64",
                "byte 0x14000 (offset 0) written 0 times")


# --- errors --------------------------------------------------------------------------------------

def failing_run(declare=True, status=WcStatus.REM_ACCESS_ERR):
    """a qp 1: WR 1 succeeds, WR 2 (a WRITE) fails half written, WR 3 (SEND) and WR 4 (posted
    after the error) are flushed; b's receive WQEs are flushed by b itself going to error."""
    run = Ideal()
    run.post_recv("b", 2, 100, 0x14000, 64)
    run.post_recv("b", 2, 101, 0x14400, 64)
    run.post_send("a", WorkRequest(1, 1, W.SEND, laddr=0x100, length=10))
    run.post_send("a", WorkRequest(1, 2, W.RDMA_WRITE, laddr=0x200, length=600, raddr=0x11000),
                  execute=False)
    run.mems["b"].write(0x11000, b"\xEE" * 256)     # the first packet landed, with any content
    run.post_send("a", WorkRequest(1, 3, W.SEND, laddr=0x300, length=10, signaled=False),
                  execute=False)
    run.post_send("a", WorkRequest(1, 4, W.RDMA_READ, laddr=0x12000, length=8, raddr=0),
                  execute=False)
    run.cqes += [("a", Completion(1, 2, status, WcOpcode.RDMA_WRITE)),
                 ("a", Completion(1, 3, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND)),
                 ("a", Completion(1, 4, WcStatus.WR_FLUSH_ERR, WcOpcode.RDMA_READ))]
    if declare:
        run.sb.expect_error("a", 1, WcStatus.REM_ACCESS_ERR)
    return run


def test_expected_error_with_flushes_passes():
    failing_run().finish().check()


def test_error_not_declared():
    check_fails(failing_run(declare=False).finish(),
                "a qp 1: unexpected error completion wr_id 0x2 status REM_ACCESS_ERR for RDMA_WRITE")


def test_declared_error_that_never_came():
    run = Ideal()
    run.post_recv("b", 2, 5, 0x14000, 8)
    run.post_send("a", WorkRequest(1, 1, W.SEND_WITH_IMM, inline=b"x"))
    run.cqes.clear()
    run.sb.expect_error("a", 1, WcStatus.RETRY_EXC_ERR)
    check_fails(run.finish(), "expected an error completion with status RETRY_EXC_ERR, none came")


def test_wrong_error_status():
    check_fails(failing_run(status=WcStatus.REM_OP_ERR).finish(),
                "first error completion is wr_id 0x2 status REM_OP_ERR, expected status REM_ACCESS_ERR")


def test_wr_after_error_not_flushed():
    run = failing_run()
    run.cqes[-1] = ("a", Completion(1, 4, S, WcOpcode.RDMA_READ, byte_len=8))
    check_fails(run.finish(), "RDMA_READ wr_id 0x4 (8 B) of a qp 1: status SUCCESS, expected WR_FLUSH_ERR")


def test_failed_wr_target_written_twice():
    run = failing_run()
    run.mems["b"].write(0x11000, b"\xEE")
    check_fails(run.finish(), "byte 0x11000 (offset 0) written 2 times, expected 0..1")


def test_flush_of_receive_queue_only_on_a_qp_in_error():
    run = failing_run()
    run.cqes.append(("b", Completion(2, 101, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, is_recv=True)))
    # b qp 2 is not in error: its WQE 101 belongs to the flushed SEND wr 3, any status is fine
    # for it, but WQE 102 (consumed by nothing) may not complete at all.
    run.finish().check()
    run2 = failing_run()
    run2.post_recv("b", 2, 102, 0x14800, 64)
    run2.cqes.append(("b", Completion(2, 102, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, is_recv=True)))
    check_fails(run2.finish(), "unexpected receive completion for receive WQE wr_id 0x66")
    run3 = failing_run()
    run3.post_recv("b", 2, 102, 0x14800, 64)
    run3.cqes.append(("b", Completion(2, 102, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, is_recv=True)))
    run3.sb.expect_error("b", 2, WcStatus.RETRY_EXC_ERR)
    run3.post_send("b", WorkRequest(2, 50, W.SEND, inline=b"q"), execute=False)
    run3.cqes.append(("b", Completion(2, 50, WcStatus.RETRY_EXC_ERR, WcOpcode.SEND)))
    run3.finish().check()


def test_send_longer_than_receive_buffer():
    def build(declare, recv_status=WcStatus.LOC_LEN_ERR):
        run = Ideal()
        run.post_recv("b", 2, 100, 0x14000, 100)
        run.post_send("a", WorkRequest(1, 1, W.SEND, laddr=0x100, length=300), execute=False)
        run.mems["b"].write(0x14000, b"\x00" * 100)     # what fitted landed, with any content
        run.cqes += [("a", Completion(1, 1, WcStatus.REM_INV_REQ_ERR, WcOpcode.SEND)),
                     ("b", Completion(2, 100, recv_status, WcOpcode.RECV, is_recv=True))]
        if declare:
            run.sb.expect_error("a", 1, WcStatus.REM_INV_REQ_ERR)
        return run.finish()
    build(True).check()
    check_fails(build(True, WcStatus.SUCCESS), "status SUCCESS, expected LOC_LEN_ERR")
    check_fails(build(False), "a qp 1: unexpected error completion wr_id 0x1 status REM_INV_REQ_ERR",
                "SEND wr_id 0x1 (300 B) of a qp 1 is longer than receive WQE wr_id 0x64 (100 B): "
                "its sender must fail with REM_INV_REQ_ERR")
    # Nobody failed: the NIC delivered it as if it fitted (and wrote past the buffer).
    run = Ideal()
    run.post_recv("b", 2, 100, 0x14000, 100)
    run.post_send("a", WorkRequest(1, 1, W.SEND, laddr=0x100, length=300))
    check_fails(run.finish(), "it must fail: declare expect_error('a', 1, REM_INV_REQ_ERR)",
                "byte 0x14064 outside every target was written 1 times")


# --- addressing and API ----------------------------------------------------------------------------

def test_translate_remote_addresses():
    def translate(side, rkey, va, length):
        # rkey 0x100: va 0x9000_0000 maps to bus 0x11000, split in two 0x80-byte pages swapped
        assert rkey == 0x100
        off = va - 0x9000_0000
        out = []
        while length:
            page, inpage = divmod(off, 0x80)
            n = min(length, 0x80 - inpage)
            out.append((0x11000 + (page ^ 1) * 0x80 + inpage, n))
            off, length = off + n, length - n
        return out
    run = Ideal(translate=translate)
    data = run.mems["a"].read(0x100, 0x100)
    run.sb.post_send("a", WorkRequest(1, 1, W.RDMA_WRITE, laddr=0x100, length=0x100,
                                      raddr=0x9000_0000, rkey=0x100))
    run.mems["b"].write(0x11080, data[:0x80])
    run.mems["b"].write(0x11000, data[0x80:])
    run.cqes.append(("a", Completion(1, 1, S, WcOpcode.RDMA_WRITE)))
    run.finish().check()


def test_api_misuse():
    run = Ideal()
    with pytest.raises(ValueError, match="not connected"):
        run.sb.post_send("a", WorkRequest(9, 1, W.SEND))
    run.sb.post_send("a", WorkRequest(1, 1, W.SEND))
    with pytest.raises(ValueError, match="reused"):
        run.sb.post_send("a", WorkRequest(1, 1, W.SEND))
    with pytest.raises(ValueError, match="already connected"):
        run.sb.connect(1, 7)
    with pytest.raises(ValueError, match="side"):
        run.sb.watch("c", 0, 1)
    sb = Scoreboard(SparseMemory(), SparseMemory())
    with pytest.raises(RuntimeError, match="snapshot"):
        sb.check()
