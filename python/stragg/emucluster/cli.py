"""The command line of stragg.emucluster (`python -m stragg.emucluster --help`).

`up` makes a cluster that outlives the command (its state under net.STATE_DIR; `up` first
removes what an earlier cluster of the same name left); `run`, `cut`, `restore`, `degrade`,
the faults (`pull`, `plug`, `reset`, `cut-pair`, `heal-pair`), `perf` and `status` attach to it;
`down` removes it. `pull HOST NIC --seconds S` blocks for S seconds, then plugs the NIC back
(also when interrupted). `run --hosts N` makes a cluster for that
run alone. `run` prefixes every output line with [h<i>] (or [h<i>.<local>]) and exits with
JobResult.worst: 0 if every process exited 0, 124 on --timeout, else the largest status among the
processes the launcher did not kill (signal s = 128 + s). With --fail-fast (default) the first
failure leaves the others --fail-grace seconds (5) to report, then kills them. Errors (no root,
no such cluster, a bad value) are one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import net
from .cluster import (
    DEFAULT_NAME,
    DEFAULT_PORT,
    EmuCluster,
    EmuClusterError,
    Terminated,
    _raise_terminated,
)

# ---------------------------------------------------------------------------------------------
# Command line


def _rate_text(rate_bit: int | None, factor: float) -> str:
    rate = "unshaped" if rate_bit is None else net.format_rate(rate_bit)
    if factor != 1.0:
        rate += f"  (degraded, l = {factor:g})"
    return rate


def _describe(status: dict[str, Any]) -> str:
    nics = int(status.get("nics", 1))
    if nics == 1:
        where = f"on bridge {net.BRIDGE}"
    else:
        where = f"of {nics} NICs on bridges {net.BRIDGE}..{net.bridge_name(nics - 1)}"
    lines = [
        (
            f"emulated cluster {status['name']!r}: {status['size']} hosts {where} "
            f"(namespace {status['switch_netns']}), subnet {status['subnet']}"
        ),
        f"  {'host':<5} {'address':<15} {'namespace':<24} {'link':<5} rate (each way)",
    ]
    for h in status["hosts"]:
        rate = _rate_text(h["rate_bit"], h["factor"])
        link = h["link"] if nics == 1 else h["nics"][0]["link"]
        if nics > 1:
            rate += f"  ({h['ifname']})"
        lines.append(f"  {h['rank']:<5} {h['addr']:<15} {h['netns']:<24} {link:<5} {rate}")
        for n in h.get("nics", [])[1:]:
            rate = _rate_text(n["rate_bit"], h["factor"]) + f"  ({n['ifname']})"
            lines.append(f"  {'':<5} {n['addr']:<15} {'':<24} {n['link']:<5} {rate}")
    pairs = status.get("cut_pairs") or []
    if pairs:
        shown = ", ".join(f"{a}-{b}" for a, b in pairs)
        lines.append(f"  cut pairs (drop each other's packets): {shown}")
    extra = []
    if status["delay_us"]:
        extra.append(f"one-way delay {status['delay_us']} us")
    if status["loss"]:
        extra.append(f"loss {status['loss'] * 100:g}% per packet")
    if extra:
        lines.append("  every packet: " + ", ".join(extra))
    ccs = sorted({h.get("congestion", "unknown") for h in status["hosts"]})
    lines.append(f"  TCP congestion control: {', '.join(ccs)}")
    idle = sorted({str(int(h.get("slow_start_after_idle", True))) for h in status["hosts"]})
    lines.append(f"  net.ipv4.tcp_slow_start_after_idle: {', '.join(idle)}")
    lines.append(f"  MASTER_ADDR={status['master_addr']} MASTER_PORT={status['master_port']}")
    return "\n".join(lines)


def _add_shape_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--hosts", type=int, required=required, help="number of emulated hosts")
    p.add_argument("--nics", type=int, default=1, help="NICs per host, each on its own switch")
    p.add_argument(
        "--rate",
        default="400mbit",
        help="link rate each way, tc units (none: unshaped); with --nics, one for every NIC or "
        "a comma list, one per NIC (200mbit,100mbit)",
    )
    p.add_argument(
        "--degrade",
        action="append",
        default=[],
        metavar="RANK=L",
        help="host RANK's link runs at rate / L (repeatable)",
    )
    p.add_argument("--delay", help="one-way delay added to every packet, e.g. 1ms (needs netem)")
    p.add_argument("--loss", help="probability a packet is dropped, e.g. 0.1%%")
    p.add_argument("--subnet", default=net.DEFAULT_SUBNET)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="MASTER_PORT / rendezvous port")
    p.add_argument(
        "--congestion",
        default=net.DEFAULT_CONGESTION,
        help=f"hosts' TCP congestion control (default {net.DEFAULT_CONGESTION}; 'system': the "
        "machine's default)",
    )
    p.add_argument(
        "--slow-start-after-idle",
        action="store_true",
        help="keep the kernel's net.ipv4.tcp_slow_start_after_idle = 1 on the hosts (default 0, "
        "as clusters tuned for training run)",
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m stragg.emucluster",
        description="An emulated multi-host cluster: network namespaces on a bridge, "
        "tc-shaped links.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    name_kw = {"default": DEFAULT_NAME, "help": f"cluster name (default {DEFAULT_NAME})"}
    p = sub.add_parser("up", help="create (or re-create) the cluster")
    _add_shape_args(p, required=True)
    p.add_argument("--name", **name_kw)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("run", help="run CMD on every host (--hosts: on a cluster made for it)")
    _add_shape_args(p, required=False)
    p.add_argument("--name", help="cluster to run on (default: the one `up` made, or a fresh one)")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--torchrun", action="store_true", help="launch with torch.distributed.run")
    p.add_argument(
        "--timeout", type=float, help="kill everything after this many seconds (exit 124)"
    )
    p.add_argument("--fail-fast", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--fail-grace", type=float, default=5.0, help="seconds a failure leaves the others"
    )
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    for verb, what in (
        ("cut", "take every link of host RANK down"),
        ("restore", "bring them back up"),
        ("reset", "reset every established TCP connection of host RANK (ss -K)"),
    ):
        p = sub.add_parser(verb, help=what)
        p.add_argument("rank", type=int)
        p.add_argument("--name", **name_kw)
    p = sub.add_parser("pull", help="pull the cable of host RANK's NIC (for good, or --seconds)")
    p.add_argument("rank", type=int)
    p.add_argument("nic", type=int, nargs="?", default=0, help="NIC index (default 0)")
    p.add_argument("--seconds", type=float, help="plug it back after this long (blocks meanwhile)")
    p.add_argument("--name", **name_kw)
    p = sub.add_parser("plug", help="plug host RANK's NIC back in")
    p.add_argument("rank", type=int)
    p.add_argument("nic", type=int, nargs="?", default=0, help="NIC index (default 0)")
    p.add_argument("--name", **name_kw)
    for verb, what in (
        ("cut-pair", "hosts A and B drop each other's packets (both reach the others)"),
        ("heal-pair", "undo cut-pair A B"),
    ):
        p = sub.add_parser(verb, help=what)
        p.add_argument("a", type=int)
        p.add_argument("b", type=int)
        p.add_argument("--name", **name_kw)
    p = sub.add_parser("degrade", help="re-shape hosts: RANK=L (L = 1: healthy again)")
    p.add_argument("specs", nargs="+", metavar="RANK=L")
    p.add_argument("--name", **name_kw)
    p = sub.add_parser("perf", help="TCP goodput of one stream from host SRC to host DST")
    p.add_argument("src", type=int)
    p.add_argument("dst", type=int)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--name", **name_kw)
    p = sub.add_parser("status", help="show the cluster(s)")
    p.add_argument("--name")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("down", help="remove everything the cluster made")
    p.add_argument("--name", **name_kw)
    return ap


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise EmuClusterError("run: no command given (usage: run [options] -- CMD ARGS...)")
    extra = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise EmuClusterError(f"bad --env {item!r}: expected KEY=VALUE")
        extra[key] = value
    if args.hosts is not None:
        cluster = EmuCluster(
            args.hosts,
            args.rate,
            args.degrade,
            args.delay,
            args.loss,
            args.name or f"run{os.getpid()}",
            args.subnet,
            args.port,
            args.congestion,
            args.slow_start_after_idle,
            nics=args.nics,
        )
    else:
        cluster = EmuCluster.attach(args.name or DEFAULT_NAME)
    with cluster:
        job = cluster.spawn(cmd, args.nproc_per_node, args.torchrun, extra)
        result = job.wait(args.timeout, args.fail_fast, args.fail_grace)
    if result.timed_out:
        print(
            f"emucluster: timed out after {args.timeout:g} s; killed {result.killed}",
            file=sys.stderr,
        )
    elif result.first_failure is not None:
        print(
            f"emucluster: {result.first_failure} failed first; exit statuses "
            f"{dict(zip(result.labels, result.returncodes))}",
            file=sys.stderr,
        )
    return result.worst


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "up":
        c = EmuCluster(
            args.hosts,
            args.rate,
            args.degrade,
            args.delay,
            args.loss,
            args.name,
            args.subnet,
            args.port,
            args.congestion,
            args.slow_start_after_idle,
            nics=args.nics,
        ).up()
        status = c.status()
        print(json.dumps(status, indent=1) if args.json else _describe(status))
        return 0
    if args.command == "run":
        return _cmd_run(args)
    if args.command == "down":
        net.check_privileges()
        removed = net.remove(net.check_name(args.name))
        print(
            f"removed {len(removed)} namespaces of {args.name!r}"
            if removed
            else f"{args.name!r}: nothing to remove"
        )
        return 0
    if args.command == "status":
        net.check_privileges()
        found, stale = [], []
        for n in [args.name] if args.name else net.cluster_names():
            try:
                found.append(EmuCluster.attach(n).status())
            except EmuClusterError:
                if args.name:
                    raise
                stale.append(n)
        for n in stale:
            print(f"emucluster: {n!r} left namespaces but no state: `down --name {n}` removes them",
                  file=sys.stderr)  # fmt: skip
        if args.json:
            print(json.dumps(found, indent=1))
        else:
            print("\n".join(_describe(s) for s in found) or "no emulated cluster is up")
        return 0
    c = EmuCluster.attach(args.name)
    if args.command == "degrade":
        for rank, factor in net.parse_degrade(args.specs, c.size).items():
            c.degrade(rank, factor)
        print(_describe(c.status()))
    elif args.command == "perf":
        bits = c.throughput(c.host(args.src).rank, c.host(args.dst).rank, args.seconds)
        rates = [c.rate_of(r) for r in (args.src, args.dst)]
        shown = " / ".join("unshaped" if r is None else net.format_rate(r) for r in rates)
        print(f"h{args.src} -> h{args.dst}: {net.format_rate(bits)} (link rates {shown})")
    elif args.command == "cut":
        c.cut(args.rank)
    elif args.command == "restore":
        c.restore(args.rank)
    elif args.command == "pull":
        _cmd_pull(c, args.rank, args.nic, args.seconds)
    elif args.command == "plug":
        c.plug(args.rank, args.nic)
        print(f"h{args.rank} {c.host(args.rank).nic(args.nic).ifname}: plugged in")
    elif args.command == "reset":
        conns = c.reset_connections(args.rank)
        print(f"h{args.rank}: reset {len(conns)} TCP connection{'s' if len(conns) != 1 else ''}")
        for local, peer in conns:
            print(f"  {local} <-> {peer}")
    elif args.command == "cut-pair":
        c.cut_pair(args.a, args.b)
        print(f"h{args.a} and h{args.b} drop each other's packets")
    elif args.command == "heal-pair":
        c.heal_pair(args.a, args.b)
        print(f"h{args.a} and h{args.b} reach each other again")
    return 0


def _cmd_pull(c: EmuCluster, rank: int, nic: int, seconds: float | None) -> None:
    """Pulls the NIC; with `seconds`, waits them out and plugs it back (also when interrupted:
    this process's timer would die with it)."""
    if seconds is not None and not seconds > 0:
        raise EmuClusterError(f"pull: --seconds must be > 0, not {seconds:g}")
    c.pull(rank, nic)
    ifname = c.host(rank).nic(nic).ifname
    if seconds is None:
        print(f"h{rank} {ifname}: cable pulled (`plug {rank} {nic}` puts it back)")
        return
    print(f"h{rank} {ifname}: cable pulled for {seconds:g} s", flush=True)
    try:
        time.sleep(seconds)
    finally:
        c.plug(rank, nic)
    print(f"h{rank} {ifname}: plugged back in")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_terminated)  # for the whole command, not only its with-blocks
    try:
        return _dispatch(args)
    except EmuClusterError as exc:
        print(f"emucluster: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as exc:  # the with-blocks tore everything down
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        print(f"emucluster: interrupted ({signal.Signals(signum).name}); stopped", file=sys.stderr)
        return 128 + signum
