"""A network namespace with a veth link to the host, and faults on that link.

For tests/reliability/test_network_faults.py, which runs as root (.ci/run):
worker processes run inside the namespace (`ip netns exec`) and reach a
throwaway PostgreSQL cluster (pgcluster.py) listening on the host end of the
veth pair. Faults are iptables rules inside the namespace only, so the host's
own firewall is never touched, and deleting the namespace deletes the veth
pair and every rule with it:

- blackhole: DROP both ways (packets vanish; nobody is told);
- reset: REJECT with a TCP reset both ways (connections die at once, also the
  server's end);
- latency: NFQUEUE to netfault_delay.py, which holds each packet 200 ms
  (the kernel has no sch_netem).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from tests.reliability.pgcluster import ThrowawayCluster

ROOT = Path(__file__).resolve().parent.parent.parent
QUEUE_NUM = 31


def unavailable() -> str | None:
    """Why no namespace with faults can be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/lib.sh ensure_netfaults installs it)"
    return None


def latency_unavailable() -> str | None:
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        return "netfilterqueue is not installed (scripts/lib.sh ensure_netfaults installs it)"
    return None


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


class Namespace:
    """One namespace, its veth pair and /30 of addresses, all named after this process."""

    def __init__(self) -> None:
        tag = os.getpid() % 10_000
        self.name = f"cqnet{tag}"
        self.host_if, self.ns_if = f"cqh{tag}", f"cqn{tag}"
        # 10.231.x.y/30 out of the pid: a pair of addresses of this test's own.
        net = ipaddress.ip_network("10.231.0.0/16")
        base = int(net.network_address) + (tag % 16_000) * 4
        self.host_ip = str(ipaddress.ip_address(base + 1))
        self.ns_ip = str(ipaddress.ip_address(base + 2))
        self._delayer: subprocess.Popen | None = None

    def create(self) -> None:
        try:
            _run("ip", "netns", "add", self.name)
            _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _run("ip", "link", "set", self.ns_if, "netns", self.name)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _run("ip", "link", "set", self.host_if, "up")
            self.exec_run("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            self.exec_run("ip", "link", "set", self.ns_if, "up")
            self.exec_run("ip", "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def exec_run(self, *args: str) -> None:
        _run(*self.exec_prefix(), *args)

    # ------------------------------------------------------------ faults
    def blackhole(self) -> None:
        self.exec_run("iptables", "-I", "OUTPUT", "-d", self.host_ip, "-j", "DROP")
        self.exec_run("iptables", "-I", "INPUT", "-s", self.host_ip, "-j", "DROP")

    def reset(self) -> None:
        for chain, side in (("OUTPUT", "-d"), ("INPUT", "-s")):
            self.exec_run(
                "iptables", "-I", chain, "-p", "tcp", side, self.host_ip,
                "-j", "REJECT", "--reject-with", "tcp-reset",
            )

    def latency(self, delay_ms: int) -> None:
        self._delayer = subprocess.Popen(
            [*self.exec_prefix(), sys.executable, "-m", "tests.reliability.netfault_delay",
             str(QUEUE_NUM), str(delay_ms)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        assert self._delayer.stdout is not None
        line = self._delayer.stdout.readline()
        assert line.strip() == "ready", line
        # --queue-bypass: should the delayer die, packets pass instead of vanishing.
        self.exec_run(
            "iptables", "-I", "OUTPUT", "-d", self.host_ip, "-j", "NFQUEUE",
            "--queue-num", str(QUEUE_NUM), "--queue-bypass",
        )

    def heal(self) -> None:
        self.exec_run("iptables", "-F", "INPUT")
        self.exec_run("iptables", "-F", "OUTPUT")
        if self._delayer is not None:
            time.sleep(0.3)  # the packets it holds go out first
            self._delayer.kill()
            self._delayer.wait()
            self._delayer = None

    def established(self, port: int) -> set[str]:
        """Local ends of the namespace's established TCP connections to the server."""
        out = subprocess.run(
            [*self.exec_prefix(), "ss", "-Htn", "state", "established",
             "dst", f"{self.host_ip}:{port}"],
            capture_output=True, text=True, timeout=10,
        ).stdout
        return {line.split()[2] for line in out.splitlines() if line.strip()}

    def destroy(self) -> None:
        """Remove the namespace (with its rules and veth pair) and the delayer; never raises."""
        if self._delayer is not None:
            with suppress(Exception):
                self._delayer.kill()
                self._delayer.wait()
        with suppress(Exception):
            _run("ip", "netns", "del", self.name)
        with suppress(Exception):
            _run("ip", "link", "del", self.host_if)  # gone with the namespace, normally


class VethCluster(ThrowawayCluster):
    """A throwaway cluster that also listens on the host end of a veth pair."""

    listen_also: str = ""

    def _configure(self, port: int) -> None:
        super()._configure(port)
        conf = self.data / "postgresql.conf"
        conf.write_text(
            conf.read_text()
            + f"listen_addresses = '127.0.0.1,{self.listen_also}'\n"
            # Server-side keepalives too, so dead clients' sessions end in seconds.
            + "tcp_keepalives_idle = 5\ntcp_keepalives_interval = 1\ntcp_keepalives_count = 3\n"
        )
        hba = self.data / "pg_hba.conf"
        if f"{self.listen_also}/30" not in hba.read_text():
            network = ipaddress.ip_network(f"{self.listen_also}/30", strict=False)
            hba.write_text(hba.read_text() + f"host all all {network} trust\n")
