"""An emulated multi-host cluster on one Linux machine: network namespaces on a bridge, every
host link shaped with tc, one command to launch a job on every host the way a real cluster does.
It exists so that multi-host behaviour (slow, lossy or cut links, ranks on several hosts) can be
run and tested without a cluster.

    python -m stragg.emucluster up --hosts 4 --rate 300mbit --degrade 3=2 [--loss 0.1%]
    python -m stragg.emucluster run [--nproc-per-node K] [--torchrun] -- python train.py
    python -m stragg.emucluster cut 3 ; python -m stragg.emucluster restore 3
    python -m stragg.emucluster degrade 3=3 ; python -m stragg.emucluster status ; ... down

    with stragg.emucluster.EmuCluster(hosts=4, rate="300mbit", degrade={3: 2.0}) as c:
        result = c.run([sys.executable, "train.py"], timeout=300)   # JobResult; .worst, .output()
        job = c.spawn([...]); c.cut(3); ...; c.restore(3); job.wait()

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN); without it every command says so and fails.
Addresses, links and qdiscs exist only inside the cluster's namespaces, which have no route out.

Modules (imports point down this list): cli (the command line), cluster (EmuCluster), jobs
(processes and their output), net (namespaces, bridge, tc shaping, cuts), perf (a goodput probe
run as a file). The measured accuracy of the shaping is in docs/benchmarks.md.
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
