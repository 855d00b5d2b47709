#!/usr/bin/env python3
"""Code footprint of a callgrind run made with --dump-instr=yes: the distinct 64-byte lines of
machine code executed, per object file, and the instructions executed.

usage: footprint.py CALLGRIND_OUT [REQUESTS]

A lone request runs on a core that PostgreSQL and the client have just used, so most of its code
is fetched from L2 or memory again: what it costs then follows the number of distinct cache lines
it executes (its footprint) more than the number of instructions. With REQUESTS (how many the
window served), the instruction count is also given per request; the footprint is the window's
union, which for a window of identical requests is one request's (plus the rare paths taken in
it: timers, the once-a-second tick). The lines run at least once per request are one
request's path without those.
"""
import re
import sys
from collections import defaultdict


def parse(path):
    lines_by_obj = defaultdict(set)
    # The most any instruction in a line was executed: how many requests took that line.
    runs = defaultdict(int)
    ir_by_obj = defaultdict(int)
    # Instructions executed in each function (its own, not its callees'), by object: what
    # hot-order.py orders the linker's layout by.
    ir_by_fn = defaultdict(int)
    # callgrind names an object (ob=) or function (fn=) by "(id) name" the first time and by
    # "(id)" after; cob= and cfn= name a call's target, in the same tables, without moving to it.
    names = {"ob": {}, "fn": {}}
    current = {"ob": "?", "fn": "?"}
    positions = []
    last = []
    after_calls = False
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\n")
        if not line:
            continue
        if line.startswith("positions:"):
            positions = line.split()[1:]
            if "instr" not in positions:
                sys.exit("run callgrind with --dump-instr=yes (no instruction positions in this file)")
            last = [0] * len(positions)
            continue
        m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line)
        if m:
            callee, table, ident, name = m.groups()
            if name:
                names[table][ident] = name
            if not callee:
                current[table] = names[table].get(ident, ident)
            continue
        if re.match(r"[a-z]+[=:]", line):
            after_calls = line.startswith("calls=")
            continue
        if not (line[0] in "+-*0123456789"):
            continue
        if not positions:
            sys.exit("no `positions:` line before the first cost line: not a callgrind file?")
        fields = line.split()
        # Each position is absolute (0x.. or decimal), relative to the last (+n, -n), or the
        # same (*); int(.., 0) reads both bases.
        pos = [
            last[i] if f == "*" else last[i] + int(f, 0) if f[0] in "+-" else int(f, 0)
            for i, f in enumerate(fields[: len(positions)])
        ]
        last = pos
        cost = int(fields[len(positions)]) if len(fields) > len(positions) else 0
        line_of = pos[positions.index("instr")] >> 6
        ob = current["ob"]
        lines_by_obj[ob].add(line_of)
        # The line after `calls=` is the call's inclusive cost, not this instruction's.
        if not after_calls:
            ir_by_obj[ob] += cost
            ir_by_fn[(ob, current["fn"])] += cost
            runs[line_of] = max(runs[line_of], cost)
        after_calls = False
    return lines_by_obj, ir_by_obj, runs, ir_by_fn


def main():
    path = sys.argv[1]
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    lines_by_obj, ir_by_obj, runs, _ = parse(path)
    total_lines = sum(len(s) for s in lines_by_obj.values())
    total_ir = sum(ir_by_obj.values())
    print(f"{'object':<60} {'code lines':>10} {'KiB':>7} {'Ir':>12}")
    for ob in sorted(lines_by_obj, key=lambda o: -len(lines_by_obj[o])):
        n = len(lines_by_obj[ob])
        print(f"{ob[-60:]:<60} {n:>10} {n * 64 / 1024:>7.1f} {ir_by_obj[ob]:>12}")
    print(f"{'all':<60} {total_lines:>10} {total_lines * 64 / 1024:>7.1f} {total_ir:>12}")
    if requests:
        print(f"requests {requests}: {total_ir / requests:.0f} instructions per request, "
              f"{total_lines} distinct 64-byte code lines ({total_lines * 64 / 1024:.1f} KiB) in the window")
        # Lines some instruction of which ran at least once per request: one request's path
        # (an instruction run k times per request counts once here, as its line is fetched once).
        every = [line for line, n in runs.items() if n >= requests]
        most = sum(1 for n in runs.values() if n >= requests / 2)
        print(f"code lines run at least once per request: {len(every)} ({len(every) * 64 / 1024:.1f} KiB); "
              f"by at least half the requests: {most} ({most * 64 / 1024:.1f} KiB)")
        # The 4 KiB pages those lines lie on: what the instruction TLB must map per request.
        pages = len({line >> 6 for line in every})
        if pages:
            print(f"4 KiB pages of code run at least once per request: {pages} "
                  f"({len(every) / pages:.1f} of their 64 lines used, on average)")


if __name__ == "__main__":
    main()
