#!/usr/bin/env python3
"""Splits fencegate's CPU per request by perf samples (bench/scripts/cpu-split.sh).

Reads `perf script --no-inline -F ip,sym` of a cpu-clock recording with call chains on stdin:
one block per sample, the sampled instruction first. A kernel sample is put under the system
call it ran in (found in its call chain); a user-space sample under the code it ran in (the
crate of the function holding the sampled instruction). Each part's share of the samples,
times the CPU per request measured from /proc, is its time per request.
"""

import argparse
import collections
import re
import sys

# System calls by the kernel function a sample's chain passes through, in this order: a
# response's send runs the receiving socket's side of loopback too (softirq), told apart first.
SYSCALLS = [
    ("do_writev", "writev: responses to clients"),
    ("__sys_sendto", "sendto: statements to the database"),
    ("__sys_recvfrom", "recvfrom: requests, and the database's replies"),
    ("do_epoll_wait", "epoll_wait: waiting for sockets"),
    ("futex", "futex: threads waking each other"),
    ("__sys_accept4", "accept4: new connections"),
]
LOOPBACK_RX = ("process_backlog", "__netif_receive_skb")

# Crates (the first known crate a function's name mentions) into the parts a request passes.
CRATES = [
    (("hyper", "hyper_util", "h2", "httparse", "http", "http_body", "http_body_util"),
     "HTTP/1 and HTTP/2 (hyper, h2, httparse, http)"),
    (("axum", "axum_core", "tower", "tower_http", "tower_service", "tower_layer",
      "futures_util", "futures_core", "pin_project_lite"),
     "layers and futures (axum, tower, futures)"),
    (("serde_json", "serde", "serde_core"), "JSON (serde_json)"),
    (("sqlx_postgres", "sqlx_core", "sqlx"), "database protocol (sqlx)"),
    (("rustls", "ring", "aws_lc_rs"), "TLS to the database (rustls, ring)"),
    (("tokio", "mio"), "runtime (tokio)"),
    (("tracing", "tracing_core", "metrics", "metrics_util", "quanta", "crossbeam_epoch"),
     "logs and metrics (tracing, metrics)"),
    (("hashbrown", "foldhash", "bytes", "itoa", "smallvec", "indexmap"),
     "containers (hashbrown, bytes)"),
    (("fencegate",), "fencegate's own code"),
]
CRATE_OF = {name: part for names, part in CRATES for name in names}
ALLOC = re.compile(r"(_rjem_|jemalloc|je_|malloc|sdallocx|free\b|__rust_alloc|__rust_dealloc)")
LIBC_MEM = re.compile(r"__mem(cpy|move|set|cmp)|memcpy|memmove|memset|memcmp")
CLOCK = re.compile(r"clock_gettime")
# ring's assembly (AES-GCM) has C names; libc's system call wrappers run before the kernel.
RING_ASM = re.compile(r"^ring_core_")
SYSCALL_WRAPPER = re.compile(r"^(epoll_wait|__GI___writev|__libc_recv|__libc_send|__send|__GI___pthread|accept4|__libc_write|__libc_read)")
PATH = re.compile(r"([a-z_][a-z0-9_]*)::")


def user_part(sym):
    if ALLOC.search(sym):
        return "allocator (jemalloc)"
    if LIBC_MEM.search(sym):
        return "memory copies and compares (libc)"
    if CLOCK.search(sym):
        return "reading the clock (vDSO)"
    if RING_ASM.search(sym):
        return "TLS to the database (rustls, ring)"
    if SYSCALL_WRAPPER.search(sym):
        return "system call wrappers (libc)"
    for crate in PATH.findall(sym):
        if crate in CRATE_OF:
            return CRATE_OF[crate]
    if sym.startswith(("core::", "<core::", "alloc::", "<alloc::", "std::", "<std::")):
        return "Rust's standard library"
    return "other user space"


def kernel_part(chain):
    for fn, part in SYSCALLS:
        if any(fn in f for f in chain):
            if fn == "do_writev" and any(rx in f for f in chain for rx in LOOPBACK_RX):
                return "writev: the client's side of loopback (its socket's receive, wake-up)"
            return part
    return "other kernel (interrupts, page faults, scheduling)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--ticks", type=int, required=True, help="user + system clock ticks")
    ap.add_argument("--user-ticks", type=int, required=True)
    ap.add_argument("--hz", type=int, required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.requests <= 0:
        sys.exit("no requests were answered in the window: is the database up?")
    samples = collections.Counter()
    kernel = user = 0
    for block in sys.stdin.read().split("\n\n"):
        chain = []
        for line in block.strip().splitlines():
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                chain.append((parts[0], parts[1]))
        if not chain:
            continue
        ip, sym = chain[0]
        if ip.startswith("ffffffff"):
            kernel += 1
            samples[("kernel", kernel_part([f for _, f in chain]))] += 1
        else:
            user += 1
            samples[("user", user_part(sym))] += 1
    total = kernel + user
    if total == 0:
        sys.exit("perf recorded no samples (perf_event_paranoid? run as root)")
    per_req = args.ticks / args.hz / args.requests * 1e6
    user_us = args.user_ticks / args.hz / args.requests * 1e6
    print(f"{args.label}: {args.requests} requests, {per_req:.1f} µs CPU per request "
          f"(user {user_us:.1f}, kernel {per_req - user_us:.1f} by /proc); "
          f"{total} samples, {100 * kernel / total:.0f}% of them in the kernel")
    for side in ("user", "kernel"):
        rows = sorted(((n, p) for (s, p), n in samples.items() if s == side), reverse=True)
        print(f"  {side}")
        for n, part in rows:
            print(f"    {per_req * n / total:6.2f} µs  {100 * n / total:5.1f}%  {part}")


if __name__ == "__main__":
    main()
