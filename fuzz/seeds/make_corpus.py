#!/usr/bin/env python3
"""Writes the committed seed corpus, fuzz/corpus/TARGET/, from real inputs.

    python3 fuzz/seeds/make_corpus.py --runs DIR... [--cache-entries FILE...]

- ELF files compiled here from fuzz/seeds/*.c (cc): a program and a PIE with a PLT, one with
  IBT's .plt.sec, one with only .debug_frame, one with it compressed (-gz=zlib), a shared
  library, and files that stand for CPython 3.10, 3.12 and 3.13 (`_PyRuntime`, `PyCode_Type`,
  `Py_Version`; 3.13's `_Py_DebugOffsets` as CPython 3.13.0 has them);
- code objects laid out as CPython 3.10-3.13 lay them out in memory (python_code);
- perf maps and /proc/PID/maps text of the forms runtimes and the kernel write;
- tests/data/*/readout.json, and the report.json, timeline.pftrace and readout.json of the
  output directories given with --runs: real runs, made with e.g.
      sysprof trace -d 2 --save-readout -o DIR -- PROGRAM
      RANK=0 LD_LIBRARY_PATH=~/.cache/sysprof/nvidia/lib sysprof trace -o DIR -- gpu_app collectives 4 3
  (gpu_app: tests/workloads/gpu_app.c, built as tests/support builds it), so that the
  timelines hold NCCL collectives;
- unwind cache entries sysprof wrote (--cache-entries, from /var/cache/sysprof/unwind).

Keep it small: the corpus is in git, and a fuzzer mutates small inputs faster.
"""

import argparse
import json
import os
import re
import struct
import subprocess
import tempfile
from pathlib import Path

FUZZ = Path(__file__).resolve().parent.parent
ROOT = FUZZ.parent
SEEDS = FUZZ / "seeds"
CORPUS = FUZZ / "corpus"

# Small files: no build id, no page of padding between segments.
SMALL = ["-Wl,--build-id=none", "-Wl,-z,noseparate-code", "-Wl,-z,norelro"]

# CPython 3.13.0's _Py_DebugOffsets (the first 568 bytes of its _PyRuntime): the fields
# sysprof reads, at their offsets; the rest zero.
DEBUG_OFFSETS_3_13 = {
    40: 632, 72: 7344, 168: 8, 184: 72, 200: 160, 232: 8, 240: 0, 248: 56, 264: 70,
    280: 112, 288: 120, 296: 128, 304: 136, 312: 68, 344: 200, 560: 40,
}


def debug_offsets_3_13() -> bytes:
    out = bytearray(568)
    out[:8] = b"xdebugpy"
    struct.pack_into("<Q", out, 8, 0x030D00F0)
    for at, value in DEBUG_OFFSETS_3_13.items():
        struct.pack_into("<Q", out, at, value)
    return bytes(out)


def put(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def compile_elfs(work: Path) -> dict:
    def cc(output, source, *flags):
        path = work / output
        subprocess.run(["cc", "-o", str(path), str(SEEDS / source), *SMALL, *flags], check=True)
        return path.read_bytes()

    def without_eh_frame(output, source, *flags):
        # The C runtime's objects bring an .eh_frame of their own: removed, so that the
        # .debug_frame is what sysprof reads.
        cc(output, source, *flags)
        subprocess.run(
            ["objcopy", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr", str(work / output)],
            check=True,
        )
        return (work / output).read_bytes()

    elfs = {
        "calls": cc("calls", "calls.c", "-O1", "-no-pie"),
        "calls-pie": cc("calls-pie", "calls.c", "-O1", "-fPIE", "-pie", "-fno-omit-frame-pointer"),
        "calls-ibt": cc("calls-ibt", "calls.c", "-O2", "-fcf-protection=full", "-Wl,-z,ibtplt", "-s"),
        "calls-debug-frame": without_eh_frame(
            "calls-debug-frame", "calls.c", "-O1", "-g1", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"
        ),
        "calls-debug-frame-zlib": without_eh_frame(
            "calls-debug-frame-zlib",
            "calls.c",
            "-O1",
            "-g1",
            "-gz=zlib",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ),
        "lib.so": cc("lib.so", "lib.c", "-O2", "-shared", "-fPIC", "-fomit-frame-pointer"),
    }
    runtime_3_13 = ", ".join(str(b) for b in debug_offsets_3_13())
    elfs["libpython3.13.so"] = cc(
        "libpython3.13.so", "python.c", "-O1", "-shared", "-fPIC", "-s", "-DPY_VERSION_HEX=0x030d00f0",
        f"-DRUNTIME_BYTES={runtime_3_13}",
    )
    elfs["libpython3.12.so"] = cc(
        "libpython3.12.so", "python.c", "-O1", "-shared", "-fPIC", "-s", "-DPY_VERSION_HEX=0x030c01f0",
        "-DRUNTIME_BYTES=1",
    )
    elfs["libpython3.10.so"] = cc("libpython3.10.so", "python.c", "-O1", "-shared", "-fPIC", "-s", "-DRUNTIME_BYTES=1")
    return elfs


# python_code's image: the memory from the code object on, at IMAGE_BASE (fuzzing.rs).
IMAGE_BASE = 0x7F00_0000_0000
CODE_TYPE = 0x7F00_DEAD_0000

# name, qualname, filename, first_line, line_table, ascii_header (code_3_10 .. code_3_12, and
# 3.13.0's debug offsets) as layout.rs has them.
LAYOUTS = {
    0: dict(name=112, qualname=None, filename=104, first_line=40, line_table=120, ascii=48),
    1: dict(name=120, qualname=128, filename=112, first_line=72, line_table=136, ascii=48),
    2: dict(name=120, qualname=128, filename=112, first_line=68, line_table=136, ascii=40),
    3: dict(name=120, qualname=128, filename=112, first_line=68, line_table=136, ascii=40),
}


def code_image(pick: int, name: str, qualname: str, filename: str, first_line: int, table: bytes,
               wide: bool = False) -> bytes:
    layout = LAYOUTS[pick]
    image = bytearray(256)
    struct.pack_into("<QQ", image, 0, 1, CODE_TYPE)
    struct.pack_into("<I", image, layout["first_line"], first_line)

    def string(text: str) -> int:
        at = len(image)
        if wide:
            chars = text.encode("utf-16-le")
            # kind 2, compact, not ascii
            state = (2 << 2) | (1 << 5)
            header = layout["ascii"] + 16
        else:
            chars = text.encode("ascii")
            state = (1 << 2) | (1 << 5) | (1 << 6)
            header = layout["ascii"]
        obj = bytearray(header)
        struct.pack_into("<QQQqI", obj, 0, 1, 0x7F00_5757_0000, len(text), -1, state)
        image.extend(obj + chars + b"\0" * 8)
        return IMAGE_BASE + at

    def byte_string(data: bytes) -> int:
        at = len(image)
        obj = bytearray(32)
        struct.pack_into("<QQQ", obj, 0, 1, 0x7F00_b7b7_0000, len(data))
        image.extend(obj + data + b"\0")
        return IMAGE_BASE + at

    struct.pack_into("<Q", image, layout["name"], string(name))
    if layout["qualname"] is not None:
        struct.pack_into("<Q", image, layout["qualname"], string(qualname))
    struct.pack_into("<Q", image, layout["filename"], string(filename))
    struct.pack_into("<Q", image, layout["line_table"], byte_string(table))
    head = bytes([pick])
    if pick == 3:
        offsets = debug_offsets_3_13()
        head += b"".join(offsets[at:at + 8] for at in (280, 288, 296, 304, 312, 560))
    return head + bytes(image)


def python_code_seeds() -> None:
    # 3.10: (bytes advanced, line delta) pairs; 3.11+: location entries (Objects/locations.md).
    table_3_10 = bytes([6, 0, 4, 2, 2, 0x80, 4, 0xFF])
    table = bytes([0x80 | 13 << 3, 2, 0x80 | 11 << 3 | 1, 0, 4, 0x80 | 14 << 3, 7, 0, 1, 1, 0x80 | 15 << 3])
    put("python_code", "3.10", code_image(0, "busy", "busy", "/app/x.py", 10, table_3_10))
    put("python_code", "3.11", code_image(1, "forward", "Model.forward", "/app/model.py", 20, table))
    put("python_code", "3.12", code_image(2, "step", "Trainer.step", "/app/train.py", 7, table))
    put("python_code", "3.12-wide", code_image(2, "étape", "Entraîneur.étape", "/app/é.py", 7, table, wide=True))
    put("python_code", "3.13", code_image(3, "run", "Job.run", "/srv/job.py", 100, table))


PERF_MAPS = {
    "python-perf-trampoline": (
        "7f5e7c1a0000 b py::<module>:/app/main.py\n"
        "7f5e7c1a000b b py::busy:/app/x.py\n"
        "7f5e7c1a0016 b py::Model.forward:/app/model.py\n"
    ),
    "jit": (
        "0x7f0000001000 0x40 LazyCompile:~main /srv/app.js:1\n"
        "7f0000002000 10 other\n"
        "7f0000002010 0 empty\n"
        "ffffffffffff0000 20 high\n"
    ),
}

PROC_MAPS = {
    "program": (
        "55d4c9a00000-55d4c9a01000 r--p 00000000 fe:01 1234 /usr/bin/prog\n"
        "55d4c9a01000-55d4c9a02000 r-xp 00001000 fe:01 1234 /usr/bin/prog\n"
        "7f6d1c600000-7f6d1c628000 r--p 00000000 fe:01 5678 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f6d1c628000-7f6d1c7bd000 r-xp 00028000 fe:01 5678 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f6d1c900000-7f6d1c910000 rwxp 00000000 00:00 0 \n"
        "7f6d1ca00000-7f6d1ca01000 r-xp 00000000 00:05 9 /tmp/a name with spaces (deleted)\n"
        "7ffd2a1f3000-7ffd2a1f5000 r-xp 00000000 00:00 0                          [vdso]\n"
        "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n"
    ),
}


def dict_line(token: str) -> str:
    escaped = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else f"\\x{ord(c):02x}" for c in token)
    return f'"{escaped}"'


def json_keys(value, keys: set) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            keys.add(key)
            json_keys(inner, keys)
    elif isinstance(value, list):
        for inner in value:
            json_keys(inner, keys)


def write_dicts() -> None:
    """libFuzzer dictionaries (fuzz/dict/TARGET.dict): the JSON files' keys, and words the
    text formats and the timeline's collectives are made of."""
    folder = FUZZ / "dict"
    folder.mkdir(exist_ok=True)
    numbers = ["0", "-1", "1e308", "-1e308", "18446744073709551615", "18446744073709551616", "4294967296", "0.5"]
    for target in ["readout", "report_json"]:
        keys = set()
        for seed in (CORPUS / target).iterdir():
            json_keys(json.loads(seed.read_bytes()), keys)
        # Field names, not the maps' keys (paths, ids).
        names = sorted(key for key in keys if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key))
        tokens = [f'"{key}":' for key in names] + numbers + ["null", "true", "false", "[]", "{}"]
        (folder / f"{target}.dict").write_text("".join(dict_line(t) + "\n" for t in tokens))
    words = ["r-xp", "rwxp", "r--p", " (deleted)", "[vdso]", "[vsyscall]", "[heap]", "[stack]", "[anon:", "00:00 0", "fe:01", "/proc/", "\n"]
    (FUZZ / "dict" / "proc_maps.dict").write_text("".join(dict_line(w) + "\n" for w in words))
    functions = (ROOT / "sysprof/src/gpu/functions.rs").read_text()
    nccl = sorted(set(re.findall(r'"(nccl[A-Za-z]+)"', functions)))
    (FUZZ / "dict" / "timeline_pftrace.dict").write_text("".join(dict_line(w) + "\n" for w in nccl))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", default=[], type=Path)
    parser.add_argument("--cache-entries", nargs="*", default=[], type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        elfs = compile_elfs(Path(work))
    for name, data in elfs.items():
        python = name.startswith("libpython")
        if not python:
            put("eh_frame", name, data)
        # The stripped files define no function to probe.
        if not python and name != "calls-ibt":
            put("uprobe_exports", name, data)
        if not python and "debug-frame" not in name:
            put("plt", name, data)
        if python or name == "lib.so":
            put("python_layout", name, data)
    python_code_seeds()
    for name, text in PERF_MAPS.items():
        put("perf_map", name, text.encode())
    for name, text in PROC_MAPS.items():
        put("proc_maps", name, text.encode())
    maps = Path(f"/proc/{os.getpid()}/maps").read_text()
    put("proc_maps", "python3", maps.encode())
    for data in sorted((ROOT / "tests" / "data").glob("*/readout.json")):
        put("readout", data.parent.name, data.read_bytes())
    for index, run in enumerate(args.runs):
        for file, target in [("report.json", "report_json"), ("timeline.pftrace", "timeline_pftrace"),
                             ("readout.json", "readout")]:
            if (run / file).exists():
                put(target, f"run{index}", (run / file).read_bytes())
    write_dicts()
    for entry in args.cache_entries:
        put("unwind_cache", entry.name[:16], entry.read_bytes())

if __name__ == "__main__":
    main()
