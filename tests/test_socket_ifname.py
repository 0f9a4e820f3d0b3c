"""STRAGG_SOCKET_IFNAME / GLOO_SOCKET_IFNAME pick the interface of stragg's TCP transport.

Two emulated hosts with two NICs each (eth0 on 10.77.0.0/24, where MASTER_ADDR is; eth1 on
10.77.1.0/24), one rank each (tests/scripts/socket_ifname_rank.py): the transport's connections
leave from the named interface's address, the results equal the float64 reference and are
bitwise identical on both ranks; interfaces that select nothing make every rank raise, naming
the rank, the list and the host's interfaces. Skips without network namespaces; FAILS then under
STRAGG_TEST_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
import sys

import _emu
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "socket_ifname_rank.py")

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]


@pytest.fixture(scope="module")
def two_nic_hosts():
    emu = _emu.emucluster()
    with emu.EmuCluster(hosts=2, nics=2, rate="1gbit", name=_emu.new_name("ifn")) as c:
        yield c


def _run(cluster, tmp_path, env: dict[str, str]) -> list[dict]:
    env = {"OMP_NUM_THREADS": "1", "STRAGG_TRANSPORT": "tcp", **env}
    res = cluster.run([sys.executable, SCRIPT, str(tmp_path)], env=env, timeout=120,
                      fail_fast=False, output=None)
    results = []
    for r in range(2):
        try:
            with open(os.path.join(tmp_path, f"rank{r}.json")) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            results.append({"rank": r, "ok": False, "error": "no result"})
    assert not res.timed_out, res.describe()
    return results


def _check_ran_over(cluster, results: list[dict], stragg_nic: int, gloo_nic: int) -> None:
    story = json.dumps(results, indent=1)[:4000]
    for r in results:
        assert r["ok"], story
        assert r["transport"] == "tcp", story
        assert all(r["exact"]), story
        # Connections other than the store's (MASTER_PORT): stragg's transport and the inner
        # Gloo's (delegated collectives, on GLOO_SOCKET_IFNAME's NIC).
        nics = cluster.nics(r["rank"])
        assert r["addresses"] == sorted({nics[stragg_nic][1], nics[gloo_nic][1]}), story
    assert results[0]["digests"] == results[1]["digests"], "ranks differ bitwise"


@pytest.mark.parametrize("spec", ["eth1", "=eth1", "^eth0,lo"])
def test_stragg_socket_ifname_picks_the_interface(two_nic_hosts, tmp_path, spec) -> None:
    # GLOO_SOCKET_IFNAME=eth0 (the emulated cluster's), MASTER_ADDR on eth0: stragg on eth1.
    results = _run(two_nic_hosts, tmp_path, {"STRAGG_SOCKET_IFNAME": spec})
    _check_ran_over(two_nic_hosts, results, stragg_nic=1, gloo_nic=0)


def test_gloo_socket_ifname_is_the_default(two_nic_hosts, tmp_path) -> None:
    # Not the route toward MASTER_ADDR (eth0): every connection but the store's is on eth1.
    results = _run(two_nic_hosts, tmp_path, {"GLOO_SOCKET_IFNAME": "eth1"})
    _check_ran_over(two_nic_hosts, results, stragg_nic=1, gloo_nic=1)


def test_interfaces_that_select_nothing_raise_on_every_rank(two_nic_hosts, tmp_path) -> None:
    results = _run(two_nic_hosts, tmp_path, {"STRAGG_SOCKET_IFNAME": "wlan"})
    story = json.dumps(results, indent=1)[:4000]
    for r in results:
        assert not r["ok"], story
        assert "STRAGG_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) 'wlan' selects no interface" in r["error"], story
        assert "eth0 10.77." in r["error"] and "eth1 10.77." in r["error"], story
        assert f"rank {r['rank']}" in r["error"], story


def test_a_bad_interface_list_is_a_settings_error(two_nic_hosts, tmp_path) -> None:
    results = _run(two_nic_hosts, tmp_path, {"STRAGG_SOCKET_IFNAME": "eth0,,eth1"})
    for r in results:
        assert not r["ok"]
        assert "STRAGG_SOCKET_IFNAME='eth0,,eth1' is not accepted" in r["error"], r
