# Ref: IBTA Vol 1 Rel 1.4 ch. 9.7 (RC ordering and exactly-once delivery), ch. 10.8 and 11.4
#      (work completions: one per signaled WR, in order; flushed WRs after an error); rdma-core
#      libibverbs/verbs.h (ibv_wc fields).
"""End-to-end scoreboard of an RDMA run between two NICs, ``"a"`` and ``"b"``.

It knows only what the host did (work requests posted, receive buffers posted, memory regions
watched) and what it saw at the end (completions, host memory contents and per-byte write
counts). From that alone, without any model of the transport, ``check()`` decides whether the
run was correct::

    sb = Scoreboard(mem_a, mem_b)            # objects with read(addr, n) and write_map()
    sb.connect(1, 2)                         # a's QP 1 talks to b's QP 2
    sb.watch("b", 0x10000, 0x8000)           # bytes that must not change unless targeted
    sb.snapshot()                            # initial images and write counts
    sb.post_send("a", wr); sb.post_recv("b", rr)      # as the test posts them
    sb.completion("a", cqe)                  # every completion polled, in order
    sb.expect_error("a", 1, WcStatus.REM_ACCESS_ERR)  # error tests only
    sb.check()                               # AssertionError naming WR and byte

What ``check`` requires (per connected QP, "before the failure" meaning every WR if no error was
declared on the QP):

* Completions. Every signaled send WR before the failure completes exactly once, SUCCESS, in
  posting order, with the right opcode (``byte_len`` = length for RDMA READ; for SEND/WRITE
  ``byte_len`` is not checked: verbs defines it only for READ, atomics and receives). With
  ``expect_error(side, qp, status)`` the first non-SUCCESS completion of the QP has ``status``
  and every later WR (signaled or not, including ones posted after the error) completes with
  WR_FLUSH_ERR; without it no error may occur. Error completions are checked on wr_id and
  status only (the other fields are undefined in verbs).
* Receive completions. The peer's receive WQEs are consumed in posting order, one per SEND
  message and one per RDMA WRITE WITH IMM, each completing once with RECV / RECV_RDMA_WITH_IMM,
  ``byte_len`` = message length, ``imm``, ``invalidated_rkey``. A SEND longer than its receive
  buffer must be the failing WR of its sender (REM_INV_REQ_ERR) and its WQE completes with
  LOC_LEN_ERR. Messages from the failing WR on may or may not complete their WQE (any status;
  data checked when SUCCESS); WQEs no message consumed complete only with WR_FLUSH_ERR and only
  on a QP declared in error. Nothing else completes.
* Data. Each byte a WR targets (WRITE: the peer's buffer at ``raddr``; SEND: the matched receive
  buffer; READ: the local buffer at ``laddr``) holds the WR's byte and was written exactly once
  (or as many times as WRs target it; the last WR of the same QP wins, WRs of different QPs may
  land in either order). Targets of the failing WR and after it may be written at most once,
  with any content. No byte of a watched region outside the targets changed or was written.

Source bytes are captured when the WR is posted (SEND/WRITE: local memory or the inline bytes;
READ: the peer's memory), so sources must not change while WRs are in flight. Remote addresses
are translated by ``translate(side, rkey, va, length) -> [(bus_addr, n), ...]`` (identity by
default). A wr_id names one WR per queue: it may not be reused on the same QP and queue.
"""

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .verbs import Completion, WcOpcode, WcStatus, WorkRequest, WrOpcode, wc_opcode

__all__ = ["HostMemory", "SparseMemory", "Scoreboard"]

SIDES = ("a", "b")
MAX_PROBLEMS = 25       # problems listed in the AssertionError (all are counted)


@runtime_checkable
class HostMemory(Protocol):
    """What the scoreboard needs of a host memory (``stellar.sim.hostmem.RecordingAxiRam`` or
    :class:`SparseMemory`): the bytes, and how many times each byte was written (a mapping
    address -> count, absent = 0; a dense sequence indexed by address works too)."""

    def read(self, addr: int, n: int) -> bytes: ...

    def write_map(self) -> Mapping[int, int]: ...


class SparseMemory:
    """A byte-addressed memory that counts writes, for pure-Python runs (unwritten bytes read
    as ``fill``). ``load`` sets bytes without counting them, as a test filling buffers would."""

    def __init__(self, fill=0):
        self.fill = fill
        self.data = {}
        self.counts = defaultdict(int)

    def load(self, addr, data):
        for i, b in enumerate(data):
            self.data[addr + i] = b

    def write(self, addr, data):
        for i, b in enumerate(bytes(data)):
            self.data[addr + i] = b
            self.counts[addr + i] += 1

    def read(self, addr, n):
        return bytes(self.data.get(a, self.fill) for a in range(addr, addr + n))

    def write_map(self):
        return self.counts


def _identity(side, rkey, va, length):
    return [(va, length)]


def _nonzero(wm):
    """``{addr: count}`` of the written bytes of a write map."""
    if hasattr(wm, "items"):
        return {int(a): int(c) for a, c in wm.items() if c}
    if hasattr(wm, "nonzero"):          # numpy array
        return {int(a): int(wm[a]) for a in wm.nonzero()[0]}
    return {a: int(c) for a, c in enumerate(wm) if c}


@dataclass
class _Wr:
    """A posted send WR as the scoreboard keeps it."""
    side: str
    wr: WorkRequest
    data: bytes             # the message bytes (READ: the peer's bytes at post time)
    seq: int                # global posting order

    @property
    def desc(self):
        w = self.wr
        return f"{w.opcode.name} wr_id {w.wr_id:#x} ({w.size} B) of {self.side} qp {w.qp}"


@dataclass
class _Target:
    """Bytes one WR must leave in one memory."""
    side: str
    addrs: list
    data: bytes
    src: _Wr
    strict: bool            # False: failed/flushed WR, at most one write, any content
    what: str               # where, for messages
    recv_id: "int | None" = None    # SEND: wr_id of the receive WQE it lands in


class Scoreboard:
    """See the module docstring. ``mem_a``/``mem_b``: :class:`HostMemory` objects;
    ``translate``: remote address translation (side of the memory, rkey, va, length) ->
    ``[(bus_addr, n), ...]``."""

    def __init__(self, mem_a, mem_b, translate: "Callable | None" = None):
        self.mems = {"a": mem_a, "b": mem_b}
        self.translate = translate or _identity
        self.peer = {}                      # (side, qp) -> (side, qp)
        self.sends = defaultdict(list)      # (side, qp) -> [_Wr] in posting order
        self.recvs = defaultdict(list)      # (side, qp) -> [RecvRequest] in posting order
        self.cqes = []                      # (side, Completion) in polling order
        self.errors = {}                    # (side, qp) -> expected WcStatus
        self.watched = []                   # (side, addr, length)
        self.images = None                  # side -> [(addr, bytes)] at snapshot
        self.baseline = None                # side -> {addr: count} at snapshot
        self._seq = 0
        self._stats = {}

    # --- what the test did ---

    def connect(self, qp_a, qp_b):
        for k in (("a", qp_a), ("b", qp_b)):
            if k in self.peer:
                raise ValueError(f"{k[0]} qp {k[1]} is already connected to {self.peer[k]}")
        self.peer["a", qp_a] = ("b", qp_b)
        self.peer["b", qp_b] = ("a", qp_a)

    def watch(self, side, addr, length):
        self._side(side)
        self.watched.append((side, addr, length))

    def snapshot(self):
        self.images = {s: [] for s in SIDES}
        for side, addr, length in self.watched:
            self.images[side].append((addr, bytes(self.mems[side].read(addr, length))))
        self.baseline = {s: _nonzero(self.mems[s].write_map()) for s in SIDES}

    def post_send(self, side, wr):
        key = (self._side(side), wr.qp)
        if key not in self.peer:
            raise ValueError(f"{side} qp {wr.qp} is not connected (Scoreboard.connect)")
        if any(p.wr.wr_id == wr.wr_id for p in self.sends[key]):
            raise ValueError(f"{side} qp {wr.qp}: send wr_id {wr.wr_id:#x} reused")
        if wr.inline is not None:
            data = wr.inline
        elif wr.opcode.is_read:
            pside = self.peer[key][0]
            data = b"".join(bytes(self.mems[pside].read(a, n))
                            for a, n in self.translate(pside, wr.rkey, wr.raddr, wr.length))
        else:
            data = bytes(self.mems[side].read(wr.laddr, wr.length))
        self._seq += 1
        self.sends[key].append(_Wr(side, wr, data, self._seq))

    def post_recv(self, side, rr):
        key = (self._side(side), rr.qp)
        if key not in self.peer:
            raise ValueError(f"{side} qp {rr.qp} is not connected (Scoreboard.connect)")
        if any(r.wr_id == rr.wr_id for r in self.recvs[key]):
            raise ValueError(f"{side} qp {rr.qp}: receive wr_id {rr.wr_id:#x} reused")
        self.recvs[key].append(rr)

    def completion(self, side, cqe):
        self.cqes.append((self._side(side), cqe))

    def expect_error(self, side, qp, status):
        self.errors[self._side(side), qp] = WcStatus(status)

    def _side(self, side):
        if side not in SIDES:
            raise ValueError(f"side {side!r} is not 'a' or 'b'")
        return side

    # --- the verdict ---

    def check(self):
        if self.images is None:
            raise RuntimeError("Scoreboard.snapshot() was not called before the run")
        problems = []
        by_queue = defaultdict(list)
        for side, c in self.cqes:
            key = (side, c.qp)
            if key not in self.peer:
                problems.append(f"{side}: completion on qp {c.qp}, which is not connected: {c}")
                continue
            by_queue[key, c.is_recv].append(c)

        fail = {}               # (side, qp) -> index in sends of the failing WR
        for key in sorted(self.peer):
            fail[key] = self._check_send_cqes(key, by_queue[key, False], problems)
        targets = []
        for key in sorted(self.peer):
            targets += self._check_recv_cqes(key, by_queue[key, True], fail, problems)
        for key in sorted(self.peer):
            for i, w in enumerate(self.sends[key]):
                strict = fail[key] is None or i < fail[key]
                if w.wr.opcode.is_write:
                    pside = self.peer[key][0]
                    addrs = self._addrs(pside, w.wr.rkey, w.wr.raddr, w.wr.size)
                    targets.append(_Target(pside, addrs, w.data, w, strict,
                                           f"raddr {w.wr.raddr:#x}"))
                elif w.wr.opcode.is_read:
                    addrs = list(range(w.wr.laddr, w.wr.laddr + w.wr.length))
                    targets.append(_Target(side_of(key), addrs, w.data, w, strict,
                                           f"laddr {w.wr.laddr:#x}"))
        self._check_memory(targets, problems)

        self._stats.update(
            send_wrs=sum(len(v) for v in self.sends.values()),
            recv_wrs=sum(len(v) for v in self.recvs.values()),
            completions=len(self.cqes),
            errors_expected=len(self.errors),
            problems=len(problems))
        if problems:
            more = len(problems) - MAX_PROBLEMS
            msg = "\n  ".join(problems[:MAX_PROBLEMS])
            raise AssertionError(f"scoreboard: {len(problems)} problem(s):\n  {msg}"
                                 + (f"\n  ... and {more} more" if more > 0 else ""))

    def report(self):
        """Counts for printing (``bytes_checked`` and ``problems`` once ``check`` ran)."""
        out = dict(connections=len(self.peer) // 2,
                   send_wrs=sum(len(v) for v in self.sends.values()),
                   recv_wrs=sum(len(v) for v in self.recvs.values()),
                   completions=len(self.cqes),
                   error_completions=sum(1 for _, c in self.cqes if c.status != WcStatus.SUCCESS),
                   watched_bytes=sum(n for _, _, n in self.watched))
        out.update(self._stats)
        return out

    # send queue completions

    def _check_send_cqes(self, key, actual, problems):
        """Checks one QP's send completions; returns the index of the failing WR (or None)."""
        side, qp = key
        wrs = self.sends[key]
        where = f"{side} qp {qp}"
        declared = self.errors.get(key)
        first_bad = next((c for c in actual if c.status != WcStatus.SUCCESS), None)
        fail = None
        if first_bad is not None:
            fail = next((i for i, w in enumerate(wrs) if w.wr.wr_id == first_bad.wr_id), None)
            if declared is None:
                problems.append(f"{where}: unexpected error completion {_cqe(first_bad)}"
                                + (f" for {wrs[fail].desc}" if fail is not None else ""))
            elif first_bad.status != declared:
                problems.append(f"{where}: first error completion is {_cqe(first_bad)}, expected "
                                f"status {declared.name}")
            if fail is None:
                problems.append(f"{where}: error completion for unknown wr_id {first_bad.wr_id:#x}")
                return None
        elif declared is not None:
            problems.append(f"{where}: expected an error completion with status {declared.name}, "
                            "none came")
        expected = []                       # (_Wr, status)
        for i, w in enumerate(wrs):
            if fail is None or i < fail:
                if w.wr.signaled:
                    expected.append((w, WcStatus.SUCCESS))
            elif i == fail:
                expected.append((w, declared if declared is not None else first_bad.status))
            else:
                expected.append((w, WcStatus.WR_FLUSH_ERR))
        self._match(where, "send", expected, actual, {w.wr.wr_id: w.desc for w in wrs}, problems,
                    self._send_fields)
        return fail

    def _send_fields(self, w, status, c):
        if c.status != status:
            return f"status {_name(WcStatus, c.status)}, expected {status.name}"
        if status != WcStatus.SUCCESS:
            return None
        if c.opcode != wc_opcode(w.wr.opcode):
            return f"opcode {_name(WcOpcode, c.opcode)}, expected {wc_opcode(w.wr.opcode).name}"
        if w.wr.opcode.is_read and c.byte_len != w.wr.length:
            return f"byte_len {c.byte_len}, expected {w.wr.length}"
        return None

    def _match(self, where, queue, expected, actual, known, problems, fields):
        """Compares completions ``actual`` with ``expected`` ([(item, status)], in order) on
        wr_id: duplicates, unknown and missing ones, order, then the fields of each pair."""
        exp_ids = [item_id(e) for e, _ in expected]
        exp_pos = {wid: i for i, wid in enumerate(exp_ids)}
        seen = defaultdict(int)
        for c in actual:
            seen[c.wr_id] += 1
        for wid, n in seen.items():
            if n > 1:
                problems.append(f"{where}: {n} {queue} completions for {known.get(wid, hex(wid))}")
            if wid not in exp_pos:
                what = (f"{known[wid]}, which should not complete" if wid in known
                        else f"unknown wr_id {wid:#x}")
                problems.append(f"{where}: unexpected {queue} completion for {what}")
        for wid in exp_ids:
            if wid not in seen:
                problems.append(f"{where}: missing {queue} completion for {known[wid]}")
        order, first = [], set()
        for c in actual:
            if c.wr_id in exp_pos and c.wr_id not in first:
                first.add(c.wr_id)
                order.append(exp_pos[c.wr_id])
        for i in range(1, len(order)):
            if order[i] <= order[i - 1]:
                a, b = expected[order[i - 1]][0], expected[order[i]][0]
                problems.append(f"{where}: {queue} completions out of order: "
                                f"{known[item_id(a)]} came before {known[item_id(b)]}")
                break
        done = set()
        for c in actual:
            if c.wr_id in exp_pos and c.wr_id not in done:
                done.add(c.wr_id)
                item, status = expected[exp_pos[c.wr_id]]
                bad = fields(item, status, c)
                if bad:
                    problems.append(f"{where}: {queue} completion of {known[c.wr_id]}: {bad}")

    # receive queue completions

    def _check_recv_cqes(self, key, actual, fail, problems):
        """Checks the receive completions of ``key`` against the messages its peer sent;
        returns the data targets of the SENDs (receive buffers)."""
        side, qp = key
        where = f"{side} qp {qp}"
        pkey = self.peer[key]
        recvs = self.recvs[key]
        known = {r.wr_id: f"receive WQE wr_id {r.wr_id:#x} ({r.length} B)" for r in recvs}
        msgs = [w for w in self.sends[pkey] if w.wr.opcode.consumes_recv]
        pfail = fail[pkey]
        pfail_seq = self.sends[pkey][pfail].seq if pfail is not None else None
        strict_exp, optional, targets = {}, {}, []
        for j, w in enumerate(msgs):
            strict = pfail_seq is None or w.seq < pfail_seq
            r = recvs[j] if j < len(recvs) else None
            if r is None:
                if strict:
                    problems.append(f"{where}: no receive WQE for {w.desc} (message {j} to it)")
                continue
            too_long = w.wr.size > r.length
            if strict and too_long:
                problems.append(f"{where}: {w.desc} is longer than {known[r.wr_id]}; it must "
                                f"fail: declare expect_error({w.side!r}, {w.wr.qp}, "
                                "REM_INV_REQ_ERR)")
                optional[r.wr_id] = (r, w)
                targets.append(_Target(side, list(range(r.addr, r.addr + r.length)), b"", w,
                                       False, f"receive WQE wr_id {r.wr_id:#x}"))
                continue
            if w.seq == pfail_seq and too_long and w.wr.opcode.is_send:
                if self.errors.get(pkey) == WcStatus.REM_INV_REQ_ERR:
                    strict_exp[r.wr_id] = (r, w, WcStatus.LOC_LEN_ERR)
                else:
                    problems.append(f"{where}: {w.desc} is longer than {known[r.wr_id]}: its "
                                    "sender must fail with REM_INV_REQ_ERR")
                    optional[r.wr_id] = (r, w)
                targets.append(_Target(side, list(range(r.addr, r.addr + r.length)), b"", w,
                                       False, f"receive WQE wr_id {r.wr_id:#x}"))
                continue
            if strict:
                strict_exp[r.wr_id] = (r, w, WcStatus.SUCCESS)
            else:
                optional[r.wr_id] = (r, w)
            if w.wr.opcode.is_send:
                n = min(w.wr.size, r.length)
                targets.append(_Target(side, list(range(r.addr, r.addr + n)), w.data[:n], w,
                                       strict, f"receive WQE wr_id {r.wr_id:#x}", r.wr_id))
        consumed = len(msgs)
        flushable = {r.wr_id: r for r in recvs[consumed:]} if key in self.errors else {}

        # Every completion that may come, in receive-queue order; the strict ones must come.
        completed = {c.wr_id for c in actual}
        expected = []
        for r in recvs:
            if r.wr_id in strict_exp:
                expected.append((strict_exp[r.wr_id], strict_exp[r.wr_id][2]))
            elif r.wr_id in completed and (r.wr_id in optional or r.wr_id in flushable):
                e = optional.get(r.wr_id)
                expected.append(((r, e[1] if e else None, None), None))
        self._match(where, "receive", expected, actual, known, problems, self._recv_fields)
        # A lenient message whose WQE completed successfully has landed: check its data.
        ok_ids = {c.wr_id for c in actual if c.status == WcStatus.SUCCESS and c.wr_id in optional}
        for t in targets:
            if t.recv_id in ok_ids:
                t.strict = True
        return targets

    def _recv_fields(self, item, status, c):
        r, w, _ = item
        if status is None:                      # optional completion: any status
            if w is None:                       # not consumed: flush only
                if c.status != WcStatus.WR_FLUSH_ERR:
                    return f"status {_name(WcStatus, c.status)}, expected WR_FLUSH_ERR"
                return None
            if c.status != WcStatus.SUCCESS:
                return None
            status = WcStatus.SUCCESS
        if c.status != status:
            return f"status {_name(WcStatus, c.status)}, expected {status.name} (message: {w.desc})"
        if status != WcStatus.SUCCESS:
            return None
        op = w.wr.opcode
        want = WcOpcode.RECV if op.is_send else WcOpcode.RECV_RDMA_WITH_IMM
        imm = w.wr.imm if op.has_imm else None
        inv = w.wr.invalidate_rkey if op is WrOpcode.SEND_WITH_INV else None
        bad = []
        if c.opcode != want:
            bad.append(f"opcode {_name(WcOpcode, c.opcode)}, expected {want.name}")
        if c.byte_len != w.wr.size:
            bad.append(f"byte_len {c.byte_len}, expected {w.wr.size}")
        if c.imm != imm:
            bad.append(f"imm {c.imm}, expected {imm}")
        if c.invalidated_rkey != inv:
            bad.append(f"invalidated_rkey {c.invalidated_rkey}, expected {inv}")
        return "; ".join(bad) + f" (message: {w.desc})" if bad else None

    # memory

    def _addrs(self, side, rkey, va, length):
        out = []
        for a, n in self.translate(side, rkey, va, length):
            out.extend(range(a, a + n))
        if len(out) != length:
            raise ValueError(f"translate({side!r}, {rkey:#x}, {va:#x}, {length}) covers "
                             f"{len(out)} bytes")
        return out

    def _check_memory(self, targets, problems):
        checked = 0
        for side in SIDES:
            mem = self.mems[side]
            now = _nonzero(mem.write_map())
            base = self.baseline[side]

            def delta(a, now=now, base=base):
                return now.get(a, 0) - base.get(a, 0)

            # Per target byte: how many writes must (need) and may (need + may) have hit it, and
            # the candidate values (by WR order; only the last one of each source QP counts).
            need, may, values, owners = (defaultdict(int), defaultdict(int), defaultdict(dict),
                                         defaultdict(list))
            mine = [t for t in targets if t.side == side]
            for t in mine:
                key = (t.src.side, t.src.wr.qp)
                for i, a in enumerate(t.addrs):
                    owners[a].append((t, i))
                    if t.strict:
                        need[a] += 1
                        prev = values[a].get(key)
                        if prev is None or prev[0] < t.src.seq:
                            values[a][key] = (t.src.seq, t.data[i])
                    else:
                        may[a] += 1
            for t in mine:
                if not t.addrs:
                    continue
                got = bytes(mem.read(t.addrs[0], len(t.addrs))) if _contiguous(t.addrs) else \
                    bytes(mem.read(a, 1)[0] for a in t.addrs)
                bad_count, bad_value = [], []
                for i, a in enumerate(t.addrs):
                    n = delta(a)
                    if not need[a] <= n <= need[a] + may[a]:
                        bad_count.append((i, a, n))
                    elif t.strict and not may[a]:
                        ok = {v for _, v in values[a].values()}
                        if got[i] not in ok:
                            bad_value.append((i, a, got[i], sorted(ok)))
                if t.strict:
                    checked += len(t.addrs)
                head = f"{side} memory, {t.what} of {t.src.desc}"
                if bad_count:
                    i, a, n = bad_count[0]
                    others = [o.src.desc for o, _ in owners[a] if o is not t]
                    problems.append(
                        f"{head}: byte {a:#x} (offset {i}) written {n} times, expected "
                        + (f"{need[a]}" if not may[a] else f"{need[a]}..{need[a] + may[a]}")
                        + (f" (also targeted by {', '.join(others)})" if others else "")
                        + (f"; {len(bad_count) - 1} more such bytes" if len(bad_count) > 1 else ""))
                if bad_value:
                    i, a, v, ok = bad_value[0]
                    want = " or ".join(f"{x:#04x}" for x in ok)
                    problems.append(f"{head}: byte {a:#x} (offset {i}) is {v:#04x}, expected {want}"
                                    + (f"; {len(bad_value) - 1} more wrong bytes"
                                       if len(bad_value) > 1 else ""))

            # Watched bytes no target names: unchanged and never written.
            for addr, image in self.images[side]:
                cur = bytes(mem.read(addr, len(image)))
                stray = [a for a in range(addr, addr + len(image))
                         if a not in owners and (cur[a - addr] != image[a - addr] or delta(a))]
                if stray:
                    a = stray[0]
                    problems.append(
                        f"{side} memory, watched region {addr:#x}+{len(image):#x}: byte {a:#x} "
                        f"outside every target was written {delta(a)} times, {image[a - addr]:#04x}"
                        f" -> {cur[a - addr]:#04x}"
                        + (f"; {len(stray) - 1} more such bytes" if len(stray) > 1 else ""))
                checked += len(image)
        self._stats["bytes_checked"] = checked


def side_of(key):
    return key[0]


def item_id(item):
    """wr_id of an expected entry: a ``_Wr`` or a receive tuple ``(RecvRequest, _Wr, status)``."""
    return item.wr.wr_id if isinstance(item, _Wr) else item[0].wr_id


def _contiguous(addrs):
    return addrs[-1] - addrs[0] == len(addrs) - 1


def _name(enum_cls, v):
    try:
        return enum_cls(v).name
    except ValueError:
        return str(v)


def _cqe(c: Completion):
    return f"wr_id {c.wr_id:#x} status {_name(WcStatus, c.status)}"

