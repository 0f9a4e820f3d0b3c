"""The network half of stragg.emucluster: namespaces, bridges, veths, tc shaping, link cuts and
the fault actions (a NIC's cable pulled, a host's TCP connections reset, a pair of hosts cut).

Layout of a cluster called NAME with N hosts of K NICs (every name below lives only inside
namespaces this module creates; the caller's own namespace gains nothing, no route, no address,
no rule):

    emu-NAME-sw   the "switches": bridge br<k> per NIC index k, and on it one port per host, the
                  switch side of a veth: h<i> for NIC 0, h<i>n<k> for NIC k > 0
    emu-NAME-h<i> host i: lo (up) and eth<k> (the host side of those veths); eth<k> has address
                  i+1 of subnet k: the cluster's subnet for k = 0, then the next ones of its size
                  (10.77.0.0/24, 10.77.1.0/24, ...). Names resolve to the NIC 0 addresses.

Every NIC is shaped on its own in both directions with an htb class at its rate: on eth<k>'s
egress (host -> switch, the NIC's upload) and on its switch port's egress (switch -> host, its
download). Optional one-way delay (netem) and loss act on the host side's egress only (of every
NIC), so every packet, whichever host sends it, is delayed and dropped once: end to end, the loss
probability and the one-way delay are exactly the configured ones. Loss is a classic-BPF filter
(`ld rand`) that classifies the unlucky packets into a class whose leaf queue holds nothing (pfifo
limit 0), so it works on kernels built without netem; generic segmentation is turned off on the
NIC then, so a loss is one wire packet, not a 64 KiB super-packet. Without loss a super-packet
holds at most 8 frames: htb lets one through whenever it has any credit, so 64 KiB ones let short
transfers beat the rate.

Every host runs TCP congestion control `reno` unless told otherwise (set_congestion): the
namespaces would inherit the machine's default, which may be bbr, and BBR (v1) leaves these
shaped links partly idle whenever flows start and stop (docs/benchmarks.md, "Emulated links").
A namespace may only pick a congestion control the machine allows unprivileged users (reno
always; cubic not always), so reno it is: at these sub-millisecond RTTs it behaves like cubic.
Hosts also run with tcp_slow_start_after_idle = 0, as clusters tuned for distributed training
do (set_slow_start_after_idle): with the kernel's 1, a connection idle for longer than its
retransmission timeout (200 ms or more) restarts slow start, which costs every collective that
talks to a peer again after a pause.

A cut (or a pulled NIC: the same for one NIC) takes the switch-side port down: the host's
eth<k> loses its carrier (as a NIC whose cable is pulled) and every packet between it and the
others vanishes without an error, RST or ICMP on either side, exactly what peers see when a real
link dies. Restoring (plugging) brings the port up; TCP connections that have not timed out
resume.

A cut pair (hosts a and b drop each other's packets, both still reach everyone else) is a u32
filter on the egress of each of their switch ports: on a's ports, IPv4 packets whose source is
any of b's addresses go to class 1:3, whose leaf queue holds nothing (pfifo limit 0, as the loss
class), and the same on b's ports for a's addresses; ARP still passes, as through a router that
drops a route. Ports of an unshaped cluster get an htb root whose default is no class (packets
pass unshaped) to hang the filter on while a pair is cut.

A connection reset destroys every established TCP socket inside a host's namespace (`ss -K`:
SOCK_DESTROY, the kernel's CONFIG_INET_DIAG_DESTROY): the local socket fails with ECONNABORTED
and the kernel sends the peer a RST, what a NIC reset or a middlebox dropping its state does.
Where the kernel cannot destroy sockets, ss prints nothing and kills nothing: the sockets are
listed again afterwards, and survivors raise an EmuClusterError saying so.
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
HOST_IF = "eth0"  # NIC 0 inside a host (NIC k: eth<k>, host_ifname(k))
BRIDGE = "br0"  # NIC 0's switch (NIC k: br<k>, bridge_name(k))
MAX_NICS = 8
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
class Nic:
    """One NIC of an emulated host: eth<index> inside the host, port on switch br<index>."""

    index: int
    ifname: str  # inside the host's namespace
    port: str  # the switch-side end of its veth, in the switch namespace
    bridge: str  # the switch (bridge) it is plugged into, in the switch namespace
    addr: str
    prefixlen: int = 24


@dataclasses.dataclass(frozen=True)
class Host:
    """One emulated host: its namespace, NIC 0's interface, port and address (the host's name
    resolves to it), every NIC, and its shaping factor (every NIC's rate = R_k / l)."""

    rank: int
    netns: str
    ifname: str
    port: str  # NIC 0's switch-side end of its veth, in the switch namespace
    addr: str
    factor: float = 1.0
    nics: tuple[Nic, ...] = ()

    def __post_init__(self) -> None:
        if not self.nics:  # one NIC (a state file written before NICs were listed)
            object.__setattr__(self, "nics", (Nic(0, self.ifname, self.port, BRIDGE, self.addr),))

    def nic(self, index: int) -> Nic:
        if not 0 <= index < len(self.nics):
            raise EmuClusterError(
                f"host {self.rank} has no NIC {index} (NICs 0..{len(self.nics) - 1})"
            )
        return self.nics[index]

    def with_factor(self, factor: float) -> Host:
        return dataclasses.replace(self, factor=factor)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Host:
        d = dict(d)
        d["nics"] = tuple(Nic(**n) for n in d.get("nics") or ())
        return cls(**d)


def host_ifname(index: int) -> str:
    return f"eth{index}"


def bridge_name(index: int) -> str:
    return f"br{index}"


def port_name(rank: int, index: int) -> str:
    """The switch-side end of host `rank`'s NIC `index` (h<rank> for NIC 0, as before NICs)."""
    return f"h{rank}" if index == 0 else f"h{rank}n{index}"


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


def parse_rates(value: Any, nics: int) -> list[int] | None:
    """A cluster's rate (one for every NIC, or a list with one per NIC) -> bit/s per NIC;
    None (or 'none') leaves every NIC unshaped. '200mbit,100mbit' is a list too."""
    if value is None or value == "none":
        return None
    if isinstance(value, str) and "," in value:
        value = [v for v in value.split(",")]
    if isinstance(value, (list, tuple)):
        if len(value) != nics:
            raise EmuClusterError(
                f"{len(value)} rates for {nics} NIC{'s' if nics != 1 else ''}: give one rate, "
                "or one per NIC"
            )
        return [parse_rate(v) for v in value]
    return [parse_rate(value)] * nics


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


def nic_subnets(subnet: str, nics: int) -> list[ipaddress.IPv4Network]:
    """NIC k's subnet: `subnet` for k = 0, then the next blocks of its size (10.77.0.0/24,
    10.77.1.0/24, ...)."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        raise EmuClusterError(f"bad subnet {subnet!r}: {exc}") from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise EmuClusterError(f"subnet {subnet!r} is not IPv4")
    if not 1 <= nics <= MAX_NICS:
        raise EmuClusterError(f"nics must be 1..{MAX_NICS}, not {nics}")
    out = []
    for k in range(nics):
        first = int(net.network_address) + k * net.num_addresses
        if first + net.num_addresses > 2**32:
            raise EmuClusterError(f"{nics} NICs' subnets do not fit after {subnet}")
        out.append(ipaddress.IPv4Network((first, net.prefixlen)))
    return out


def create(name: str, count: int, subnet: str = DEFAULT_SUBNET, nics: int = 1) -> list[Host]:
    """Creates the switches and `count` hosts of `nics` NICs each (unshaped). The caller
    removes leftovers first."""
    nets = nic_subnets(subnet, nics)
    if count < 1 or count > nets[0].num_addresses - 2:
        raise EmuClusterError(
            f"{count} hosts do not fit in subnet {subnet} (1..{nets[0].num_addresses - 2})"
        )
    addrs = [list(n.hosts())[:count] for n in nets]
    sw = switch_ns(name)
    ip(None, f"netns add {sw}")
    ip(sw, "link set lo up")
    for k in range(nics):
        br = bridge_name(k)
        ip(sw, f"link add {br} type bridge")
        ip(sw, f"link set {br} addrgenmode none")
        ip(sw, f"link set {br} up")
    hosts = []
    for rank in range(count):
        ns = host_ns(name, rank)
        ip(None, f"netns add {ns}")
        ip(ns, "link set lo up")
        host_nics = []
        for k in range(nics):
            port, ifname, br = port_name(rank, k), host_ifname(k), bridge_name(k)
            # Both ends are born inside our namespaces: the caller's namespace never sees them.
            ip(sw, f"link add {port} type veth peer name {ifname} netns {ns}")
            ip(sw, f"link set {port} addrgenmode none")
            ip(sw, f"link set {port} master {br}")
            ip(sw, f"link set {port} up")
            ip(ns, f"link set {ifname} addrgenmode none")  # no IPv6 chatter
            ip(ns, f"addr add {addrs[k][rank]}/{nets[k].prefixlen} dev {ifname}")
            ip(ns, f"link set {ifname} up")
            host_nics.append(Nic(k, ifname, port, br, str(addrs[k][rank]), nets[k].prefixlen))
        n0 = host_nics[0]
        hosts.append(Host(rank, ns, n0.ifname, n0.port, n0.addr, 1.0, tuple(host_nics)))
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


def shape(
    name: str, host: Host, rate_bit: int, loss: float = 0.0, delay_us: int = 0, nic: int = 0
) -> None:
    """Both directions of host's NIC `nic` at rate_bit; delay and loss on its egress only.
    Re-shaping a port drops its cut-pair filters: the caller applies them again
    (set_pair_filters)."""
    n = host.nic(nic)
    _shape_dev(host.netns, n.ifname, rate_bit, loss, delay_us)
    _shape_dev(switch_ns(name), n.port, rate_bit, 0.0, 0)


def set_link(name: str, host: Host, up: bool, nic: int | None = None) -> None:
    """Host's NIC `nic` (None: every NIC) plugged in (up) or its cable pulled (down)."""
    nics = host.nics if nic is None else (host.nic(nic),)
    for n in nics:
        ip(switch_ns(name), f"link set dev {n.port} {'up' if up else 'down'}")


def link_is_up(name: str, host: Host, nic: int = 0) -> bool:
    out = ip(switch_ns(name), f"-j link show dev {host.nic(nic).port}").stdout
    flags = json.loads(out)[0].get("flags", [])
    return "UP" in flags


# Cut pairs: on a switch port's egress, packets from a host it is cut from go to class 1:3,
# whose queue holds nothing. Class 1:1 (the rate) and 1:2 (loss, host side only) are shaping's.
_DROP_CLASS = "1:3"
_PAIR_PRIO = 3


def _has_htb_root(netns: str, dev: str) -> bool:
    out = tc(netns, f"-j qdisc show dev {dev} root").stdout
    try:
        qdiscs = json.loads(out or "[]")
    except ValueError:
        return False
    return any(q.get("kind") == "htb" and q.get("handle") == "1:" for q in qdiscs)


def _has_class(netns: str, dev: str, classid: str) -> bool:
    return bool(tc(netns, f"class show dev {dev} classid {classid}").stdout.strip())


def set_pair_filters(name: str, host: Host, blocked: list[str], shaped: bool) -> None:
    """Every switch port of `host` drops the IPv4 packets whose source is in `blocked` (the
    addresses of the hosts it is cut from) and passes the rest; [] removes the filters.
    `shaped`: the ports carry shaping's htb root (else one is added, with no default class so
    that every other packet passes unshaped, and removed again with the last filter)."""
    sw = switch_ns(name)
    for n in host.nics:
        # Deleting the filters of this priority is idempotent (an error when there are none).
        tc(sw, f"filter del dev {n.port} parent 1: protocol ip prio {_PAIR_PRIO}", check=False)
        if not blocked:
            if not shaped and _has_htb_root(sw, n.port):
                tc(sw, f"qdisc del dev {n.port} root")
            continue
        if not _has_htb_root(sw, n.port):
            if shaped:
                raise EmuClusterError(f"switch port {n.port} of host {host.rank} lost its qdisc")
            tc(sw, f"qdisc add dev {n.port} root handle 1: htb default 0")
        if not _has_class(sw, n.port, _DROP_CLASS):
            tc(sw, f"class add dev {n.port} parent 1: classid {_DROP_CLASS} htb rate 8kbit")
            tc(sw, f"qdisc add dev {n.port} parent {_DROP_CLASS} handle 30: pfifo limit 0")
        for addr in blocked:
            tc(sw, f"filter add dev {n.port} parent 1: protocol ip prio {_PAIR_PRIO} u32 match ip "
                   f"src {addr}/32 flowid {_DROP_CLASS}")  # fmt: skip


def pair_drops(name: str, host: Host) -> int:
    """Packets the cut-pair filters of host's switch ports dropped so far (for checks)."""
    total = 0
    for n in host.nics:
        out = tc(switch_ns(name), f"-s class show dev {n.port} classid {_DROP_CLASS}").stdout
        m = re.search(r"\(dropped (\d+)", out)
        total += int(m.group(1)) if m else 0
    return total


# ---------------------------------------------------------------------------------------------
# TCP connections


def _ss() -> str:
    found = shutil.which("ss")
    if found is None:
        raise EmuClusterError("resetting connections needs the `ss` command (Debian iproute2)")
    return found


def _endpoint(text: str) -> str:
    """ss's '[::ffff:10.77.0.1]:29500' -> '10.77.0.1:29500' (IPv4-mapped addresses unwrapped)."""
    return re.sub(r"^\[::ffff:([0-9.]+)\]", r"\1", text)


def _established(host: Host, kill: bool) -> list[tuple[str, str]]:
    """The established TCP connections in host's namespace as (local, peer) 'addr:port' pairs;
    kill=True destroys them (ss -K) and returns those ss reports destroyed."""
    argv = ["ip", "netns", "exec", host.netns, _ss(), *(["-K"] if kill else []),
            "-t", "-n", "-H", "state", "established"]  # fmt: skip
    done = _cmd(argv, check=False)
    if done.returncode != 0:
        raise EmuClusterError(
            f"`ss{' -K' if kill else ''}` in host {host.rank}'s namespace failed: "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )
    conns = []
    for line in done.stdout.splitlines():
        fields = line.split()
        # Recv-Q Send-Q Local:Port Peer:Port [Process]
        if len(fields) >= 4:
            conns.append((_endpoint(fields[2]), _endpoint(fields[3])))
    return conns


def reset_connections(host: Host) -> list[tuple[str, str]]:
    """Destroys every established TCP connection in host's namespace (the peers get a RST);
    returns them as (local, peer). Raises EmuClusterError when some survive: the kernel cannot
    destroy sockets (it lacks CONFIG_INET_DIAG_DESTROY), which ss itself does not report."""
    before = set(_established(host, kill=False))
    reported = _established(host, kill=True)
    # What ss printed is no proof: it is what it tried. A connection of `before` still
    # established now was not destroyed (one that came up meanwhile is not in `before`).
    after = set(_established(host, kill=False))
    survivors = sorted(before & after)
    killed = sorted(set(reported) - after)
    if survivors:
        local, peer = survivors[0]
        raise EmuClusterError(
            f"cannot reset the TCP connections of host {host.rank}: `ss -K` destroyed "
            f"{len(killed)} of {len(before)} (still established: {local} <-> {peer}"
            f"{f' and {len(survivors) - 1} more' if len(survivors) > 1 else ''}); this kernel "
            "cannot destroy sockets (it needs CONFIG_INET_DIAG_DESTROY), so a connection reset "
            "cannot be emulated here"
        )
    return killed


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
