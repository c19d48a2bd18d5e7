# Ref: include/uapi/linux/vfio.h, include/uapi/linux/iommufd.h
"""stellar.host.vfio's ioctl numbers, constants and ctypes structure layouts against the
kernel headers of this machine, compiled with the system C compiler.

A generated C program includes ``<linux/vfio.h>`` (and ``<linux/iommufd.h>`` when the system
has it), prints ``sizeof`` / ``offsetof`` / field sizes of every structure the backend declares
and the value of every ioctl number and constant; the test compares each with the Python side.
Names the header does not have (the device-cdev ioctls before Linux 6.6, iommufd before 6.2)
are reported as not checked, never silently passed; the tests skip only when there is no C
compiler or no ``<linux/vfio.h>``.
"""

import ctypes
import shutil
import subprocess

import pytest
from stellar.host import vfio

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _compile_probe(tmp_path, body, includes):
    src = tmp_path / "abi.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n" + includes + "\nint main(void) {\n"
                   + body + "\n    return 0;\n}\n")
    exe = tmp_path / "abi"
    run = subprocess.run([CC, "-std=gnu11", "-o", str(exe), str(src)], capture_output=True,
                         text=True)
    if run.returncode:
        pytest.fail(f"the ABI probe did not compile:\n{run.stderr}\n--- source ---\n{src.read_text()}")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return out


def _header_present(tmp_path, header):
    src = tmp_path / "has.c"
    src.write_text(f"#include <{header}>\nint main(void) {{ return 0; }}\n")
    return subprocess.run([CC, "-fsyntax-only", str(src)], capture_output=True).returncode == 0


def _guard(name):
    """The preprocessor symbol whose presence says the header has ``name``."""
    if name in vfio.VFIO_CDEV_NAMES or name in ("vfio_device_bind_iommufd",
                                                "vfio_device_attach_iommufd_pt",
                                                "vfio_device_detach_iommufd_pt"):
        return "defined(VFIO_DEVICE_BIND_IOMMUFD)"
    if name.startswith("IOMMU_") or name.startswith("iommu_"):
        return "HAVE_IOMMUFD"
    return None


def _probe_source():
    lines = []

    def guarded(name, text):
        g = _guard(name)
        if g:
            lines.append(f"#if {g}\n{text}\n#else\n    printf(\"absent {name}\\n\");\n#endif")
        else:
            lines.append(text)

    for name in {**vfio.IOCTLS, **vfio.CONSTANTS}:
        guarded(name, f'    printf("C {name} %llu\\n", (unsigned long long)({name}));')
    for st in vfio.STRUCTS:
        c = f"struct {st.c_name}"
        text = [f'    printf("S {st.c_name} %zu\\n", sizeof({c}));']
        for fname, _ in st._fields_:
            text.append(f'    printf("F {st.c_name}.{fname} %zu %zu\\n", offsetof({c}, {fname}), '
                        f'sizeof((({c} *)0)->{fname}));')
        guarded(st.c_name, "\n".join(text))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def abi(tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler (cc/gcc/clang) on this machine: the ABI cannot be checked")
    tmp = tmp_path_factory.mktemp("vfio_abi")
    if not _header_present(tmp, "linux/vfio.h"):
        pytest.skip("<linux/vfio.h> is missing: install the kernel UAPI headers "
                    "(Debian/Ubuntu: apt-get install linux-libc-dev)")
    has_iommufd = _header_present(tmp, "linux/iommufd.h")
    includes = "#include <linux/vfio.h>\n"
    if has_iommufd:
        includes += "#include <linux/iommufd.h>\n#define HAVE_IOMMUFD 1\n"
    else:
        includes += "#define HAVE_IOMMUFD 0\n"
    out = _compile_probe(tmp, _probe_source(), includes)
    consts, sizes, fields, absent = {}, {}, {}, []
    for line in out.splitlines():
        kind, name, *vals = line.split()
        if kind == "C":
            consts[name] = int(vals[0])
        elif kind == "S":
            sizes[name] = int(vals[0])
        elif kind == "F":
            fields[name] = (int(vals[0]), int(vals[1]))
        else:
            absent.append(name)
    return {"consts": consts, "sizes": sizes, "fields": fields, "absent": absent,
            "iommufd": has_iommufd}


def test_ioctl_numbers_and_constants(abi):
    checked = 0
    for name, value in {**vfio.IOCTLS, **vfio.CONSTANTS}.items():
        if name in abi["absent"]:
            continue
        assert abi["consts"][name] == value, f"{name}: header {abi['consts'][name]:#x}, Python {value:#x}"
        checked += 1
    print(f"\n{checked} ioctl numbers / constants equal to the header's; not in this header: "
          f"{sorted(n for n in abi['absent'] if n.upper() == n)}")
    # the container/group/device/type1 core must always be checked
    core = {n for n in {**vfio.IOCTLS, **vfio.CONSTANTS} if vfio.IOMMUFD_NAMES.isdisjoint({n})
            and n not in vfio.VFIO_CDEV_NAMES}
    assert core <= set(abi["consts"])


def test_struct_layouts(abi):
    checked_structs = checked_fields = 0
    for st in vfio.STRUCTS:
        if st.c_name in abi["absent"]:
            continue
        for fname, _ in st._fields_:
            off, size = abi["fields"][f"{st.c_name}.{fname}"]
            desc = getattr(st, fname)
            assert (desc.offset, desc.size) == (off, size), \
                f"{st.c_name}.{fname}: header offset {off} size {size}, ctypes {desc.offset} {desc.size}"
            checked_fields += 1
        c_size, py_size = abi["sizes"][st.c_name], ctypes.sizeof(st)
        if st.extensible:
            # argsz-sized: a newer header may append fields; the kernel accepts our shorter one
            assert py_size <= c_size, f"{st.c_name}: ctypes {py_size} > header {c_size}"
        else:
            assert py_size == c_size, f"{st.c_name}: header sizeof {c_size}, ctypes {py_size}"
        checked_structs += 1
    print(f"\n{checked_structs} structures ({checked_fields} fields) equal to the header's; not in "
          f"this header: {sorted(n for n in abi['absent'] if n.lower() == n)}")
    assert checked_structs >= 11       # the group/container/device/type1 structures


def test_iommufd_checked_or_reported(abi):
    """iommufd's names are compared when the header exists; otherwise they are listed as
    absent (and this test says so), never counted as checked."""
    names = [n for n in vfio.IOMMUFD_NAMES] + [s.c_name for s in vfio.STRUCTS
                                               if s.c_name.startswith("iommu_")]
    if abi["iommufd"]:
        assert not set(names) & set(abi["absent"])
    else:
        assert set(names) <= set(abi["absent"])
        pytest.skip("<linux/iommufd.h> is not on this machine (kernel headers older than 6.2): "
                    f"{len(names)} iommufd ioctl numbers / constants / structures not checked")


def test_cdev_ioctls_checked_or_reported(abi):
    names = set(vfio.VFIO_CDEV_NAMES) | {"vfio_device_bind_iommufd",
                                         "vfio_device_attach_iommufd_pt",
                                         "vfio_device_detach_iommufd_pt"}
    if names <= set(abi["absent"]):
        pytest.skip("<linux/vfio.h> predates the VFIO device cdev (Linux 6.6): "
                    f"{len(names)} cdev ioctl numbers / structures not checked")
    assert not names & set(abi["absent"])
