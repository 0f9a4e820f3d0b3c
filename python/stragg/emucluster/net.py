"""The network half of stragg.emucluster: namespaces, bridge, veths, tc shaping, link cuts.

Layout of a cluster called NAME with N hosts (every name below lives only inside namespaces this
module creates; the caller's own namespace gains nothing, no route, no address, no rule):

    emu-NAME-sw   the "switch": bridge br0 and one port h<i> per host (the switch side of a veth)
    emu-NAME-h<i> host i: lo (up) and eth0 (the host side of that veth), address i+1 of the subnet

Every host link is shaped in both directions with an htb class at the host's rate: on eth0's
egress (host -> switch, the host's upload) and on port h<i>'s egress (switch -> host, its
download). Optional one-way delay (netem) and loss act on eth0's egress only, so every packet,
whichever host sends it, is delayed and dropped once: end to end, the loss probability and the
one-way delay are exactly the configured ones. Loss is a classic-BPF filter (`ld rand`) that
classifies the unlucky packets into a class whose leaf queue holds nothing (pfifo limit 0), so it
works on kernels built without netem; generic segmentation is turned off on eth0 then, so a loss
is one wire packet, not a 64 KiB super-packet. Without loss a super-packet holds at most 8 frames:
htb lets one through whenever it has any credit, so 64 KiB ones let short transfers beat the rate.

Every host runs TCP congestion control `reno` unless told otherwise (set_congestion): the
namespaces would inherit the machine's default, which may be bbr, and BBR (v1) leaves these
shaped links partly idle whenever flows start and stop (docs/benchmarks.md, "Emulated links").
A namespace may only pick a congestion control the machine allows unprivileged users (reno
always; cubic not always), so reno it is: at these sub-millisecond RTTs it behaves like cubic.
Hosts also run with tcp_slow_start_after_idle = 0, as clusters tuned for distributed training
do (set_slow_start_after_idle): with the kernel's 1, a connection idle for longer than its
retransmission timeout (200 ms or more) restarts slow start, which costs every collective that
talks to a peer again after a pause.

A cut takes the switch-side port h<i> down: host i's eth0 loses its carrier (as a NIC whose cable
is pulled) and every packet between host i and the others vanishes without an error, RST or ICMP
on either side, exactly what peers see when a real link dies. Restoring brings the port up; TCP
connections that have not timed out resume.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Any

NS_PREFIX = "emu-"
HOST_IF = "eth0"
BRIDGE = "br0"
DEFAULT_SUBNET = "10.77.0.0/24"
STATE_DIR = os.environ.get("STRAGG_EMUCLUSTER_STATE_DIR", "/run/stragg-emucluster")
NETNS_ETC = "/etc/netns"  # `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]{0,31}")
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
# Classic BPF: A = random u32; A > T -> return 0 (no match: the htb default class, delivered);
# else return classid 1:2 (the class that drops). k of `ld rand` is SKF_AD_OFF + SKF_AD_RANDOM.
_LOSS_BPF = "4,32 0 0 4294963256,37 0 1 {threshold},6 0 0 0,6 0 0 65538"


class EmuClusterError(RuntimeError):
    """An emulated-cluster operation failed; the message says which and why."""


class PrivilegeError(EmuClusterError):
    """The caller lacks root / CAP_NET_ADMIN + CAP_SYS_ADMIN."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One emulated host: its namespace, interface, address and shaping factor (rate = R / l)."""

    rank: int
    netns: str
    ifname: str
    port: str  # the switch-side end of its veth, in the switch namespace
    addr: str
    factor: float = 1.0


# ---------------------------------------------------------------------------------------------
# Parsing of user-facing values


_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "kibit": 1024,
    "mibit": 1024**2,
    "gibit": 1024**3,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
}


def parse_rate(text: str | int) -> int:
    """'400mbit' -> 400_000_000 (bits per second; tc's units: 'bps' means bytes per second)."""
    if isinstance(text, int):
        bits = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = m.group(2).lower() if m else ""
        if not m or (unit and unit not in _RATE_UNITS):
            raise EmuClusterError(
                f"bad rate {text!r}: expected a number and a unit such as 300mbit, 1gbit, 50mbps"
            )
        bits = int(float(m.group(1)) * _RATE_UNITS[unit or "bit"])
    if bits < 8000:
        raise EmuClusterError(f"rate {text!r} is below 8kbit")
    return bits


def format_rate(bits: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.4g} {unit}"
    return f"{bits:.0f} bit/s"


def parse_loss(value: str | float | None) -> float:
    """'0.1%' -> 0.001; a float is a fraction in [0, 1)."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", value)
        if not m:
            raise EmuClusterError(f"bad loss {value!r}: expected a percentage such as 0.1%")
        value = float(m.group(1)) / 100.0
    if not 0.0 <= float(value) < 1.0:
        raise EmuClusterError(f"bad loss {value!r}: must be in [0%, 100%)")
    return float(value)


def parse_delay(value: str | float | None) -> int:
    """'1ms' -> 1000 (microseconds); a float is seconds."""
    if value is None or value == "":
        return 0
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|ms|us)\s*", value)
        if not m:
            raise EmuClusterError(f"bad delay {value!r}: expected a time such as 1ms, 500us")
        value = float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
    if float(value) < 0:
        raise EmuClusterError(f"bad delay {value!r}: must not be negative")
    return round(float(value) * 1e6)


def parse_degrade(specs: Any, hosts: int) -> dict[int, float]:
    """{3: 2.0} or ['3=2', ...] -> {rank: l}; host `rank` runs at R / l in both directions."""
    if isinstance(specs, dict):
        items = list(specs.items())
    else:
        items = []
        for spec in specs or ():
            m = re.fullmatch(r"\s*(\d+)\s*=\s*(\d+(?:\.\d+)?)\s*", str(spec))
            if not m:
                raise EmuClusterError(f"bad --degrade {spec!r}: expected RANK=L, e.g. 3=2")
            items.append((int(m.group(1)), float(m.group(2))))
    out: dict[int, float] = {}
    for rank, factor in items:
        rank, factor = int(rank), float(factor)
        if not 0 <= rank < hosts:
            raise EmuClusterError(f"degraded host {rank} does not exist (hosts 0..{hosts - 1})")
        if factor < 1.0:
            raise EmuClusterError(f"degrade factor of host {rank} is {factor}: must be >= 1")
        if rank in out:
            raise EmuClusterError(f"host {rank} is degraded twice")
        out[rank] = factor
    return out


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise EmuClusterError(
            f"bad cluster name {name!r}: 1-32 characters, letters, digits, '_' and '.'"
        )
    return name


# ---------------------------------------------------------------------------------------------
# Privileges and tools


def _effective_caps() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        return None
    return None


def check_privileges() -> None:
    """Raises PrivilegeError (one line) unless namespaces, links and qdiscs can be made here."""
    caps = _effective_caps()
    if caps is None:
        if os.geteuid() != 0:
            raise PrivilegeError("needs root to create network namespaces: run it as root (sudo)")
    else:
        missing = [
            n
            for n, b in (("CAP_NET_ADMIN", _CAP_NET_ADMIN), ("CAP_SYS_ADMIN", _CAP_SYS_ADMIN))
            if not caps >> b & 1
        ]
        if missing:
            raise PrivilegeError(
                f"needs root ({' and '.join(missing)} missing) to create network namespaces, "
                "links and qdiscs: run it as root (sudo)"
            )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise EmuClusterError(f"needs the `{tool}` command (Debian package iproute2)")


def _cmd(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmuClusterError(f"`{' '.join(argv)}` failed: {exc}") from exc
    if check and done.returncode != 0:
        raise EmuClusterError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout}")
    return done


def ip(netns: str | None, cmd: str, *raw: str, check: bool = True) -> subprocess.CompletedProcess:
    """`ip [-n netns] CMD RAW...`: cmd is split at spaces (names have none), raw args are not."""
    return _cmd(["ip", *(["-n", netns] if netns else []), *cmd.split(), *raw], check)


def tc(netns: str, cmd: str, *raw: str, check: bool = True) -> subprocess.CompletedProcess:
    """`tc -n netns CMD RAW...`, split as for ip()."""
    return _cmd(["tc", "-n", netns, *cmd.split(), *raw], check)


# ---------------------------------------------------------------------------------------------
# Namespaces


def switch_ns(name: str) -> str:
    return f"{NS_PREFIX}{name}-sw"


def host_ns(name: str, rank: int) -> str:
    return f"{NS_PREFIX}{name}-h{rank}"


def all_namespaces() -> list[str]:
    out = _cmd(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def own_namespaces(name: str) -> list[str]:
    """This cluster's namespaces that exist now: hosts in rank order, then the switch."""
    pat = re.compile(rf"{re.escape(NS_PREFIX + name)}-(sw|h(\d+))")
    found = [(m, ns) for ns in all_namespaces() if (m := pat.fullmatch(ns))]
    hosts = sorted((int(m.group(2)), ns) for m, ns in found if m.group(2) is not None)
    return [ns for _, ns in hosts] + [ns for m, ns in found if m.group(2) is None]


def cluster_names() -> list[str]:
    """Names of the emulated clusters present (their switch namespace exists)."""
    pat = re.compile(rf"{re.escape(NS_PREFIX)}(.+)-sw")
    return sorted(m.group(1) for ns in all_namespaces() if (m := pat.fullmatch(ns)))


def netns_pids(netns: str) -> list[int]:
    out = _cmd(["ip", "netns", "pids", netns], check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _kill_pids(pids: list[int], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def remove(name: str, grace_s: float = 2.0) -> list[str]:
    """Deletes everything of cluster `name` (idempotent): kills what still runs inside its
    namespaces, deletes them (with them every veth and the bridge) and its state file."""
    found = own_namespaces(name)
    pids = sorted({pid for ns in found for pid in netns_pids(ns)} - {os.getpid()})
    if pids:
        _kill_pids(pids, grace_s)
    for ns in found:
        ip(None, f"netns del {ns}", check=False)
    pat = re.compile(rf"{re.escape(NS_PREFIX + name)}-(sw|h\d+)")
    if os.path.isdir(NETNS_ETC):
        for entry in os.listdir(NETNS_ETC):
            if pat.fullmatch(entry):
                shutil.rmtree(os.path.join(NETNS_ETC, entry), ignore_errors=True)
    left = own_namespaces(name)
    if left:
        raise EmuClusterError(f"could not delete namespaces {left} of cluster {name!r}")
    try:
        os.unlink(state_path(name))
    except FileNotFoundError:
        pass
    return found


def create(name: str, count: int, subnet: str = DEFAULT_SUBNET) -> list[Host]:
    """Creates the switch and `count` hosts (unshaped). The caller removes leftovers first."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        raise EmuClusterError(f"bad subnet {subnet!r}: {exc}") from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise EmuClusterError(f"subnet {subnet!r} is not IPv4")
    if count < 1 or count > net.num_addresses - 2:
        raise EmuClusterError(
            f"{count} hosts do not fit in subnet {subnet} (1..{net.num_addresses - 2})"
        )
    addrs = list(net.hosts())[:count]
    sw = switch_ns(name)
    ip(None, f"netns add {sw}")
    ip(sw, "link set lo up")
    ip(sw, f"link add {BRIDGE} type bridge")
    ip(sw, f"link set {BRIDGE} addrgenmode none")
    ip(sw, f"link set {BRIDGE} up")
    hosts = []
    for rank in range(count):
        ns, port = host_ns(name, rank), f"h{rank}"
        ip(None, f"netns add {ns}")
        # Both ends are born inside our namespaces: the caller's namespace never sees them.
        ip(sw, f"link add {port} type veth peer name {HOST_IF} netns {ns}")
        ip(sw, f"link set {port} addrgenmode none")
        ip(sw, f"link set {port} master {BRIDGE}")
        ip(sw, f"link set {port} up")
        ip(ns, "link set lo up")
        ip(ns, f"link set {HOST_IF} addrgenmode none")  # no IPv6 chatter
        ip(ns, f"addr add {addrs[rank]}/{net.prefixlen} dev {HOST_IF}")
        ip(ns, f"link set {HOST_IF} up")
        hosts.append(Host(rank, ns, HOST_IF, port, str(addrs[rank])))
    _write_hosts_files(name, hosts)
    return hosts


def _write_sysctl(
    host: Host, path: str, value: str, check: bool = True
) -> subprocess.CompletedProcess:
    """Writes `value` to the /proc/sys file `path` inside host's namespace."""
    return _cmd(["ip", "netns", "exec", host.netns, "sh", "-c", f"echo {value} > {path}"], check)


def _read_sysctl(host: Host, path: str) -> str:
    """The /proc/sys file `path` inside host's namespace ('' if unreadable)."""
    return _cmd(["ip", "netns", "exec", host.netns, "cat", path], check=False).stdout.strip()


CONGESTION_SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"
DEFAULT_CONGESTION = "reno"


def set_congestion(hosts: list[Host], algorithm: str) -> None:
    """Every host's default TCP congestion control ('system': leave the machine's default)."""
    if algorithm == "system":
        return
    if not re.fullmatch(r"[a-z0-9_]+", algorithm):
        raise EmuClusterError(f"bad congestion control {algorithm!r}")
    for h in hosts:
        done = _write_sysctl(h, CONGESTION_SYSCTL, algorithm, check=False)
        if done.returncode != 0:
            try:
                with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
                    allowed = f.read().strip()
            except OSError:
                allowed = ""
            raise EmuClusterError(
                f"cannot set TCP congestion control {algorithm!r} in host {h.rank}'s namespace "
                f"(the machine allows namespaces: {allowed or 'unknown'}; 'system' keeps the "
                f"machine's default): {done.stderr.strip()}"
            )


SLOW_START_AFTER_IDLE_SYSCTL = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"


def set_slow_start_after_idle(hosts: list[Host], on: bool) -> None:
    """Every host's tcp_slow_start_after_idle (per namespace; the kernel's default is on)."""
    for h in hosts:
        _write_sysctl(h, SLOW_START_AFTER_IDLE_SYSCTL, str(int(on)))


def slow_start_after_idle_of(host: Host) -> bool:
    return _read_sysctl(host, SLOW_START_AFTER_IDLE_SYSCTL) == "1"


def congestion_of(host: Host) -> str:
    return _read_sysctl(host, CONGESTION_SYSCTL) or "unknown"


def _write_hosts_files(name: str, hosts: list[Host]) -> None:
    """Every host resolves every other by name (h<i> and emu-NAME-h<i>), forward and reverse,
    as on a real cluster; the machine's own /etc/hosts entries stay valid inside."""
    try:
        with open("/etc/hosts") as f:
            base = f.read()
    except OSError:
        base = "127.0.0.1 localhost\n"
    if not re.search(r"^::1\s", base, re.MULTILINE):
        base = base.rstrip() + "\n::1 localhost\n"
    # The IPv4-mapped lines let dual-stack servers (c10d's TCPStore) name their peers; they
    # carry only the long name, so that h<i> resolves to the IPv4 address alone.
    lines = "".join(f"{h.addr} {h.netns} h{h.rank}\n::ffff:{h.addr} {h.netns}\n" for h in hosts)
    for h in hosts:
        d = os.path.join(NETNS_ETC, h.netns)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write(f"{base.rstrip()}\n# stragg.emucluster {name}\n{lines}")


# ---------------------------------------------------------------------------------------------
# Shaping and cuts


GSO_SEGS = 8  # frames per super-packet on a shaped link (12 KiB: 0.3 ms at 300 Mbit/s)


def _shape_dev(netns: str, dev: str, rate_bit: int, loss: float, delay_us: int) -> None:
    tc(netns, f"qdisc del dev {dev} root", check=False)
    tc(netns, f"qdisc add dev {dev} root handle 1: htb default 1")
    quantum = min(max(rate_bit // 8 // 100, 1514), 200000)  # >= MTU, and htb stays quiet
    rate = f"rate {rate_bit}bit ceil {rate_bit}bit quantum {quantum}"
    tc(netns, f"class add dev {dev} parent 1: classid 1:1 htb {rate}")
    if delay_us:
        netem = f"qdisc add dev {dev} parent 1:1 handle 10: netem delay {delay_us}us limit 100000"
        done = tc(netns, netem, check=False)
        if done.returncode != 0:
            raise EmuClusterError(
                "--delay needs the netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM): "
                f"{done.stderr.strip()}"
            )
    if loss:
        tc(netns, f"class add dev {dev} parent 1: classid 1:2 htb {rate}")
        tc(netns, f"qdisc add dev {dev} parent 1:2 handle 20: pfifo limit 0")
        bpf = _LOSS_BPF.format(threshold=min(int(loss * 2**32), 2**32 - 1))
        tc(netns, f"filter add dev {dev} parent 1: protocol all prio 1 bpf bytecode", bpf)
    # One wire packet per qdisc decision when packets are dropped; else super-packets of at most
    # GSO_SEGS frames (cheaper than single frames; a 64 KiB one would leave htb 44 frames in
    # debt, so a 100 KiB transfer ran at twice the shaped rate and fooled the link probes).
    ip(netns, f"link set dev {dev} gso_max_segs {1 if loss else GSO_SEGS}")


def shape(name: str, host: Host, rate_bit: int, loss: float = 0.0, delay_us: int = 0) -> None:
    """Both directions of host's link at rate_bit; delay and loss on its egress only."""
    _shape_dev(host.netns, host.ifname, rate_bit, loss, delay_us)
    _shape_dev(switch_ns(name), host.port, rate_bit, 0.0, 0)


def set_link(name: str, host: Host, up: bool) -> None:
    ip(switch_ns(name), f"link set dev {host.port} {'up' if up else 'down'}")


def link_is_up(name: str, host: Host) -> bool:
    out = ip(switch_ns(name), f"-j link show dev {host.port}").stdout
    flags = json.loads(out)[0].get("flags", [])
    return "UP" in flags


# ---------------------------------------------------------------------------------------------
# State file (what `up` made, for `run` / `cut` / `status` in later commands)


def state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


def write_state(name: str, state: dict) -> None:
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    tmp = state_path(name) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, state_path(name))


def read_state(name: str) -> dict | None:
    try:
        with open(state_path(name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
