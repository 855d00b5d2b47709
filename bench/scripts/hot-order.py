#!/usr/bin/env python3
"""The linker's order for fencegate's hot functions, from callgrind runs of its request paths.

usage: hot-order.py OUT CALLGRIND_OUT...

Each CALLGRIND_OUT is a run of the fencegate binary made with `MANGLED=1 FOOTPRINT=1
bench/scripts/callgrind.sh` (symbol names as the linker knows them, and instruction positions).
OUT gets the functions of the binary (the object that ran the most instructions) that ran in any
of them, hottest first by the instructions they ran themselves (each run weighted alike), one
mangled name per line: a symbol ordering file for lld, which rustc links with on x86-64 Linux.
A build laid out by it (the code a request runs packed together instead of spread over the
whole text; the flags reach only the binary's own link, and it replaces target/release/fencegate):

    cargo rustc --release --locked --bin fencegate -- \
        -C link-arg=-Wl,--symbol-ordering-file=$PWD/OUT -C link-arg=-Wl,--no-warn-symbol-ordering

Measured (bench/RESULTS.md): half the 4 KiB pages of code per lone request, the same
instructions and lines, and no difference in a lone request's CPU, so the release build does
not use it.
"""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from footprint import parse  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, dumps = sys.argv[1], sys.argv[2:]
    weight = defaultdict(float)
    for dump in dumps:
        _, ir_by_obj, _, ir_by_fn = parse(dump)
        # The binary profiled is the object that ran the most instructions (libc is next).
        binary = max(ir_by_obj, key=ir_by_obj.get)
        ours = {fn: ir for (ob, fn), ir in ir_by_fn.items() if ob == binary}
        if not any(fn.startswith("_ZN") or fn.startswith("_R") for fn in ours):
            sys.exit(f"{dump}: names are demangled; run callgrind.sh with MANGLED=1")
        total = sum(ours.values())
        for fn, ir in ours.items():
            if ir > 0:
                # callgrind names a recursive call's inner levels fn'2, fn'3...
                weight[fn.split("'")[0]] += ir / total
    names = sorted(weight, key=lambda fn: -weight[fn])
    with open(out, "w") as f:
        for fn in names:
            f.write(fn + "\n")
    print(f"{out}: {len(names)} functions, hottest first")


if __name__ == "__main__":
    main()
