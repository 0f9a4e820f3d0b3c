"""An emulated multi-host cluster on one Linux machine: network namespaces on a bridge, every
host link shaped with tc, one command to launch a job on every host the way a real cluster does.
It exists so that multi-host behaviour (slow, lossy or cut links, ranks on several hosts) can be
run and tested without a cluster.

    python -m stragg.emucluster up --hosts 4 --rate 300mbit --degrade 3=2 [--loss 0.1%] [--nics 2]
    python -m stragg.emucluster run [--nproc-per-node K] [--torchrun] -- python train.py
    python -m stragg.emucluster cut 3 ; python -m stragg.emucluster restore 3
    python -m stragg.emucluster degrade 3=3 ; python -m stragg.emucluster status ; ... down
    python -m stragg.emucluster pull 2 1 [--seconds 10] ; ... plug 2 1     (host 2's NIC 1)
    python -m stragg.emucluster reset 2 ; ... cut-pair 1 2 ; ... heal-pair 1 2

    with stragg.emucluster.EmuCluster(hosts=4, rate="300mbit", degrade={3: 2.0}) as c:
        result = c.run([sys.executable, "train.py"], timeout=300)   # JobResult; .worst, .output()
        job = c.spawn([...]); c.cut(3); ...; c.restore(3); job.wait()

    with stragg.emucluster.EmuCluster(hosts=4, nics=2, rate="150mbit") as c:
        c.nics(2)                       # [("eth0", "10.77.0.3"), ("eth1", "10.77.1.3")]
        job = c.spawn([...]); c.pull(2, 1, seconds=10)     # NIC 1 of host 2 out for 10 s
        c.reset_connections(2); c.cut_pair(1, 2); c.heal_pair(1, 2); job.wait()

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN); without it every command says so and fails.
Addresses, links and qdiscs exist only inside the cluster's namespaces, which have no route out.

Modules (imports point down this list): cli (the command line), cluster (EmuCluster), jobs
(processes and their output), net (namespaces, bridges, tc shaping, cuts, the fault actions),
perf (a goodput probe run as a file). The measured accuracy of the shaping is in docs/benchmarks.md.
"""

from __future__ import annotations

from . import cluster, net
from .cli import main
from .cluster import (
    DEFAULT_NAME,
    DEFAULT_PORT,
    EmuCluster,
    EmuClusterError,
    Host,
    Job,
    JobResult,
    PrivilegeError,
    ProcSpec,
    Terminated,
)

__all__ = [*cluster.__all__, "main"]
