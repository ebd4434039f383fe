"""Several Slurm nodes on one machine: one network namespace per node, joined by a bridge.

Node ``nodeK`` of a stack on base port P lives in the namespace ``ptP-nodeK``
([ip-netns(8)](https://man7.org/linux/man-pages/man8/ip-netns.8.html)) with one end of a veth
pair ([veth(4)](https://man7.org/linux/man-pages/man4/veth.4.html)) addressed 10.213.X.K/24; the
other end is a port of the bridge ``ptPbr`` in the root namespace, which holds the head's address
10.213.X.254 (slurmctld's). X is derived from P, so two stacks do not share a subnet. No route
leads anywhere else: traffic stays on these addresses.

Each slurmd (and so every job it starts) enters its node's network namespace and runs in a UTS
and a mount namespace of its own ([unshare(1)](https://man7.org/linux/man-pages/man1/unshare.1.html)
``--uts --mount``): its host name is the node's name, as on a real cluster, and the stack's hosts
file, which names the head and every node, is bind-mounted over ``/etc/hosts`` there. The
machine's own ``/etc/hosts`` is never edited, and everything else of the filesystem is shared.
(``ip netns exec`` would bind ``/etc/netns/<namespace>/hosts`` instead, but it also remounts
``/sys`` for the namespace, which hides the cgroup filesystem slurmd wants.)

Every namespace and link is named after the base port, so :func:`remove` finds what a crashed
stack left behind by that prefix alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deployments.stack.processes import StackError, run


def name_prefix(base_port: int) -> str:
    """Of every namespace and link of the stack on ``base_port``: at most 15 characters with a
    link's suffix, Linux's limit for a link name."""
    return f"pt{base_port}"


@dataclass(frozen=True)
class NodeNetwork:
    base_port: int
    count: int
    hosts_file: Path

    @property
    def prefix(self) -> str:
        return name_prefix(self.base_port)

    @property
    def names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.count + 1)]

    @property
    def subnet(self) -> str:
        return f"10.213.{self.base_port % 256}"

    @property
    def head_address(self) -> str:
        return f"{self.subnet}.254"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def address(self, node: str) -> str:
        return f"{self.subnet}.{self.names.index(node) + 1}"

    def namespace(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def link(self, node: str) -> str:
        return f"{self.prefix}n{node.removeprefix('node')}"

    def hosts(self) -> str:
        lines = ["127.0.0.1 localhost", f"{self.head_address} head"]
        return "\n".join(lines + [f"{self.address(n)} {n}" for n in self.names]) + "\n"

    def on_node(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``node``: in its network namespace, with the stack's hosts file, under
        its name. Mounts made later on the machine still show there (``--propagation slave``)."""
        return ["nsenter", f"--net=/run/netns/{self.namespace(node)}",
                "unshare", "--uts", "--mount", "--propagation", "slave",
                "sh", "-c", 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"',
                str(self.hosts_file), node, *argv]


def _namespaces(prefix: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"{prefix}-")]


def _links(prefix: str) -> list[str]:
    listed = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in listed.splitlines()]
    return [name for name in names if name.startswith(prefix)]


def present(net: NodeNetwork) -> bool:
    """Every namespace and link of ``net`` exists, and nothing else of its prefix."""
    return (sorted(_namespaces(net.prefix)) == sorted(map(net.namespace, net.names))
            and sorted(_links(net.prefix)) == sorted([net.bridge, *map(net.link, net.names)]))


def leftovers(prefix: str) -> list[str]:
    """What of a stack is still on the machine: its namespaces and links."""
    return [*_namespaces(prefix), *_links(prefix)]


def remove(prefix: str) -> None:
    """Delete every namespace and link of a stack's prefix, whatever the count of nodes that
    created them, and end what still runs in those namespaces. A namespace's end of a veth pair
    goes with it, and the other end with that."""
    for ns in _namespaces(prefix):
        # What still runs on a node ends with it: a job step that outlived its killed slurmd (a
        # lost node) would otherwise keep the namespace alive, unnamed, and never finish.
        for pid in run(["ip", "netns", "pids", ns], check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        run(["ip", "netns", "delete", ns])
    for link in _links(prefix):
        run(["ip", "link", "delete", link], check=False)  # a veth end may have gone with its peer


def _refuse_taken_subnet(net: NodeNetwork) -> None:
    listed = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    for line in listed.splitlines():
        device, address = line.split()[1], line.split()[3]
        if address.startswith(f"{net.subnet}.") and not device.startswith(net.prefix):
            raise StackError(f"{net.subnet}.0/24 is already on {device} ({address}); start the stack on "
                             f"another --base-port (the subnet's third number is the port modulo 256)")


def create(net: NodeNetwork) -> None:
    """The hosts file, the bridge with the head's address, then each node's namespace and veth pair."""
    _refuse_taken_subnet(net)
    net.hosts_file.write_text(net.hosts())
    run(["ip", "link", "add", net.bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{net.head_address}/24", "dev", net.bridge])
    run(["ip", "link", "set", net.bridge, "up"])
    for node in net.names:
        ns, link = net.namespace(node), net.link(node)
        run(["ip", "netns", "add", ns])
        run(["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", link, "master", net.bridge, "up"])
        for argv in (["addr", "add", f"{net.address(node)}/24", "dev", "eth0"],
                     ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"]):
            run(["ip", "-n", ns, *argv])
