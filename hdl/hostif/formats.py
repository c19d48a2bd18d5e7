# Ref: rdma-core libibverbs/verbs.h (ibv_send_wr, ibv_recv_wr, ibv_wc); PCI Express Base 4.0
#      2.4.1 (posted writes are not reordered among themselves: a CQE's bytes land before the
#      next TLP's)
"""Formats of the queues in host memory, declared once (pure Python, no amaranth): the 64-byte
send work queue entry, the 32-byte receive work queue entry and the 32-byte completion queue
entry, plus the doorbell words. The queue engine (gateware), the host driver and the tests all
use these tables; ``python -m stellar.hdl.hostif.formats`` prints them as Markdown.

Every entry is stored little-endian: the table's bit ``8 * k`` is bit 0 of byte ``k`` of the
entry in memory (``int.from_bytes(entry, "little")`` gives the value ``unpack`` takes).

Rings. Each send queue (SQ), receive queue (RQ) and completion queue (CQ) is a ring of
``2 ** log_size`` entries at a bus address aligned to its size in bytes (at least 64 B).
Indexes are free-running 16-bit counters; entry ``i`` lives at ``base + (i % size) * entry``.

- SQ / RQ: the host writes entries at its producer index, then writes the new producer index
  into the queue's doorbell (one MMIO write posts every entry up to it: a batch). The NIC reads
  the entries by DMA, in order, and consumes them.
- CQ: the NIC writes each completion at its producer index with the ``owner`` bit set to
  ``1 - ((index >> log_size) & 1)`` (1 on the first pass over the ring, 0 on the second, ...).
  The host zeroes the ring once, then polls memory: the entry at its consumer index ``ci`` is
  new when ``owner == 1 - ((ci >> log_size) & 1)``; no MMIO read is needed. The host returns
  entries by writing its consumer index to the CQ doorbell (needed for the NIC to reuse them,
  may be batched), optionally arming the CQ for one interrupt.
"""

import argparse

from ..flow.fields import QPN_BITS, FieldTable
from ..transport.formats import INLINE_MAX

__all__ = ["SQ_WQE", "RQ_WQE", "CQE", "SQ_DOORBELL", "RQ_DOORBELL", "CQ_DOORBELL",
           "SQ_WQE_BYTES", "RQ_WQE_BYTES", "CQE_BYTES", "INDEX_BITS", "cqe_owner"]

INDEX_BITS = 16          # producer / consumer indexes are free-running 16-bit counters

SQ_WQE = FieldTable("sq_wqe", [
    ("opcode", 4, "WrOpcode (ibv_wr_opcode values: RDMA_WRITE 0, RDMA_WRITE_WITH_IMM 1, SEND 2, "
                  "SEND_WITH_IMM 3, RDMA_READ 4, SEND_WITH_INV 9)"),
    ("signaled", 1, "write a completion on success (IBV_SEND_SIGNALED; errors always complete)"),
    ("inline", 1, f"payload is in `data` (length <= {INLINE_MAX}, IBV_SEND_INLINE), not at laddr"),
    ("rsvd0", 26, "0"),
    ("length", 32, "message length in bytes"),
    ("wr_id", 64, "returned in the completion"),
    ("raddr", 64, "remote virtual address (WRITE / READ)"),
    ("rkey", 32, "remote key (WRITE / READ)"),
    ("imm", 32, "immediate data (*_WITH_IMM) or the rkey to invalidate (SEND_WITH_INV), as an "
                "integer (the ImmDt / IETH field carries it big-endian)"),
    ("data", INLINE_MAX * 8, "inline: the payload, byte 0 in bits 7:0; otherwise bits 63:0 = "
                             "laddr, the bus address of the local buffer (payload source for "
                             "SEND/WRITE, destination for READ), the rest 0"),
], "Send work queue entry, 64 bytes.")

RQ_WQE = FieldTable("rq_wqe", [
    ("wr_id", 64, "returned in the completion"),
    ("addr", 64, "bus address of the receive buffer"),
    ("length", 32, "receive buffer length in bytes"),
    ("rsvd0", 96, "0"),
], "Receive work queue entry, 32 bytes: one buffer for one incoming SEND or WRITE_WITH_IMM.")

CQE = FieldTable("cqe", [
    ("wr_id", 64, "of the work request"),
    ("byte_len", 32, "bytes received (receive completions) or read (RDMA READ)"),
    ("imm", 32, "immediate data (has_imm) or the invalidated rkey (has_inv)"),
    ("qp", 16, "local QP index"),
    ("src_qpn", QPN_BITS, "remote QP number (receive completions)"),
    ("status", 8, "WcStatus (ibv_wc_status values)"),
    ("opcode", 8, "WcOpcode (ibv_wc_opcode values)"),
    ("rsvd0", 64, "0"),
    ("is_recv", 1, "1: receive completion (from the QP's RQ); 0: send completion (its SQ)"),
    ("has_imm", 1, "IBV_WC_WITH_IMM"),
    ("has_inv", 1, "IBV_WC_WITH_INV"),
    ("rsvd1", 4, "0"),
    ("owner", 1, "phase bit, in the entry's last byte: 1 - ((index >> log_size) & 1)"),
], "Completion queue entry, 32 bytes; written by the NIC in one DMA write.")

SQ_DOORBELL = FieldTable("sq_doorbell", [
    ("pi", INDEX_BITS, "new producer index: every entry before it is posted"),
    ("qp", 16, "QP index"),
], "Send-queue doorbell: one 32-bit MMIO write.")

RQ_DOORBELL = FieldTable("rq_doorbell", [
    ("pi", INDEX_BITS, "new producer index: every entry before it is posted"),
    ("qp", 16, "QP index"),
], "Receive-queue doorbell: one 32-bit MMIO write.")

CQ_DOORBELL = FieldTable("cq_doorbell", [
    ("ci", INDEX_BITS, "new consumer index: every entry before it is free again"),
    ("cq", 15, "CQ number"),
    ("arm", 1, "request one interrupt for the next completion (after moderation)"),
], "Completion-queue doorbell: one 32-bit MMIO write.")

SQ_WQE_BYTES = SQ_WQE.width // 8
RQ_WQE_BYTES = RQ_WQE.width // 8
CQE_BYTES = CQE.width // 8
assert (SQ_WQE_BYTES, RQ_WQE_BYTES, CQE_BYTES) == (64, 32, 32)


def cqe_owner(index, log_size):
    """The ``owner`` bit the NIC writes into the CQE at producer index ``index``, and the value
    the host expects at consumer index ``index`` for a new entry."""
    return 1 - ((index >> log_size) & 1)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m stellar.hdl.hostif.formats",
                                     description="Print the host queue formats as Markdown.")
    parser.parse_args(argv)
    for table in (SQ_WQE, RQ_WQE, CQE, SQ_DOORBELL, RQ_DOORBELL, CQ_DOORBELL):
        print(table.markdown())
        print()


if __name__ == "__main__":
    main()
