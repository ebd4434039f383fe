"""A real Slurm cluster with accounting: munged, MariaDB, slurmdbd, slurmctld and one slurmd
per node, configured and kept under the stack directory (docs/local-stack.md, "Slurm settings";
slurm.conf(5), slurmdbd.conf(5)). One node is ``localhost``; several are ``node1``...``nodeN``,
each in its own network namespace (deployments/stack/nodes.py).

The daemons run as root with their own sockets, ports, pid files and state, so nothing in
/etc or /var/lib is edited and a second cluster can run beside the first on other ports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deployments.stack import nodes
from deployments.stack.processes import (
    StackError, port_open, run, running_pid, start_detached, stop, wait_until,
)

DB_NAME = "slurm_acct_db"
DB_USER, DB_PASS = "slurm", "slurmdbpass"
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")


@dataclass(frozen=True)
class SlurmLayout:
    """Where everything of one cluster lives, and its ports."""

    root: Path
    base_port: int
    nodes: int = 1

    @property
    def network(self) -> nodes.NodeNetwork | None:
        return nodes.NodeNetwork(self.base_port, self.nodes, self.root / "etc" / "hosts") if self.nodes > 1 else None

    @property
    def slurmds(self) -> dict[str, str]:
        """The key of each node's slurmd (its pid and log file names), to the node's name."""
        if self.network is None:
            return {"slurmd": "localhost"}
        return {f"slurmd@{node}": node for node in self.network.names}

    @property
    def daemons(self) -> list[str]:
        """Every daemon in start order, slurmd once per node."""
        return [*DAEMONS[:-1], *self.slurmds]

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "etc" / "gres.conf"

    @property
    def dbd_conf(self) -> Path:
        return self.root / "etc" / "slurmdbd.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def mysql_socket(self) -> Path:
        return self.root / "mysql" / "mysqld.sock"

    @property
    def mysql_port(self) -> int:
        return self.base_port + 3

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def log(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}


def installed() -> bool:
    return all(shutil.which(p) for p in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch"))


def _cpus_and_memory(nodes: int) -> tuple[int, int]:
    # Declaring more CPUs than the machine has (config_overrides) lets tests run several
    # multi-task jobs at once on 2 cores; memory is 90% of the real amount. Several nodes share
    # the machine: each declares 2 CPUs (one rank per node, one thread per rank) and its share.
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    if nodes > 1:
        return 2, int(mem_kb / 1024 * 0.9 / nodes)
    return max(8, os.cpu_count() or 1), int(mem_kb / 1024 * 0.9)


def _node_settings(layout: SlurmLayout, cpus: int, mem_mb: int) -> dict[str, str]:
    """SlurmctldHost, the slurmd files and the nodes: ``localhost`` on 127.0.0.1, or each node at
    its namespace's address with files of its own (slurm.conf(5): %n is the node's name) and the
    controller at the head's address on the bridge."""
    r, net = layout.root, layout.network
    node = f"CPUs={cpus} RealMemory={mem_mb} Gres={PREEMPT_GRES} State=UNKNOWN"
    if net is None:
        return {"host": "localhost", "pid": f"{r}/run/slurmd.pid", "spool": f"{r}/spool",
                "log": str(layout.log("slurmd")), "nodes": f"NodeName=localhost NodeAddr=127.0.0.1 {node}\n"}
    # A node whose slurmd dies is DOWN after 10 s, not the default 300 s: the tests lose one.
    return {"host": f"localhost({net.head_address})", "pid": f"{r}/run/slurmd@%n.pid", "spool": f"{r}/spool/%n",
            "log": f"{r}/log/slurmd@%n.log",
            "nodes": "SlurmdTimeout=10\n" + "".join(f"NodeName={n} NodeAddr={net.address(n)} {node}\n"
                                                     for n in net.names)}


# A countable generic resource with no device behind it (gres.conf(5): Count without File), one per
# node. A preemptible job and its preemptor both ask for it, so the preemptor takes it from that
# job alone: jobs in `debug` are never preempted, and tests that preempt run beside the others.
PREEMPT_GRES = "preemptslot:1"


def write_config(layout: SlurmLayout) -> bool:
    """Write the cluster's configuration; True when it changed (running daemons must restart)."""
    for sub in ("etc", "state", "spool", "log", "run", "munge", "mysql",
                *(f"spool/{node}" for node in layout.slurmds.values() if layout.network)):
        (layout.root / sub).mkdir(parents=True, exist_ok=True)
    node = _node_settings(layout, *_cpus_and_memory(layout.nodes))
    r, port = layout.root, layout.base_port
    auth = f"socket={layout.munge_socket}"
    gres_name = PREEMPT_GRES.split(":")[0]
    before = [p.read_text() if p.exists() else None for p in (layout.conf, layout.gres_conf)]
    layout.gres_conf.write_text("".join(f"NodeName={n} Name={gres_name} Count=1\n" for n in layout.slurmds.values()))
    layout.conf.write_text(f"""\
# Written by `pretrain stack`; settings explained in docs/local-stack.md and slurm.conf(5).
ClusterName=pretrain
SlurmctldHost={node['host']}
SlurmctldPort={port}
SlurmdPort={port + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo={auth},cred_expire=5
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={node['pid']}
StateSaveLocation={r}/state
SlurmdSpoolDir={node['spool']}
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
KillWait=5
MinJobAge=60
EnforcePartLimits=ALL
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={port + 2}
# For the slurmdbd connection this names the munge socket (slurm.conf(5), AccountingStoragePass).
AccountingStoragePass={layout.munge_socket}
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmctldDebug=info
SlurmctldLogFile={layout.log('slurmctld')}
SlurmdDebug=info
SlurmdLogFile={node['log']}
SlurmdParameters=config_overrides
# Preemption as clusters with spot capacity configure it: a job in `urgent` takes the resources
# of jobs in `preemptible` (requeued) and `spot` (cancelled after a grace period, the trainer's
# time to save); jobs in `debug` are not preempted.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
GresTypes={gres_name}
{node['nodes']}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=preemptible Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=spot Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=15
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
""")
    layout.dbd_conf.write_text(f"""\
AuthType=auth/munge
AuthInfo={auth}
DbdHost=localhost
DbdPort={port + 2}
DebugLevel=info
LogFile={layout.log('slurmdbd')}
PidFile={r}/run/slurmdbd.pid
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={layout.mysql_port}
StorageLoc={DB_NAME}
StorageUser={DB_USER}
StoragePass={DB_PASS}
""")
    layout.dbd_conf.chmod(0o600)  # slurmdbd refuses a readable file holding the DB password
    return [layout.conf.read_text(), layout.gres_conf.read_text()] != before


# ---------------------------------------------------------------- one function per daemon


def _start_munged(layout: SlurmLayout) -> None:
    key = layout.root / "munge" / "munge.key"
    if not key.exists():
        if Path("/etc/munge/munge.key").exists():
            shutil.copyfile("/etc/munge/munge.key", key)
        else:
            run(["mungekey", "--create", f"--keyfile={key}"])
        key.chmod(0o400)
    # As root, munged needs --force (its log and socket are root-owned, which it calls insecure).
    run(["munged", "--force", f"--socket={layout.munge_socket}", f"--key-file={key}",
         f"--pid-file={layout.pid_file('munged')}", f"--log-file={layout.log('munged')}",
         f"--seed-file={layout.root / 'munge' / 'munged.seed'}"])
    wait_until(lambda: subprocess.run(["munge", "-n", "-S", str(layout.munge_socket)],
                                      capture_output=True).returncode == 0,
               10, "munged", layout.log("munged"))


def _mysql(layout: SlurmLayout, sql: str) -> None:
    run(["mariadb", "--no-defaults", "-S", str(layout.mysql_socket), "-u", "root", "-e", sql])


def _start_mariadbd(layout: SlurmLayout) -> None:
    data = layout.root / "mysql" / "data"
    if not (data / "mysql").exists():
        run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=socket", "--skip-test-db"])
    start_detached(["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
                    f"--socket={layout.mysql_socket}", "--bind-address=127.0.0.1",
                    f"--port={layout.mysql_port}", "--skip-name-resolve",
                    f"--pid-file={layout.root / 'mysql' / 'mysqld.pid'}",
                    f"--log-error={layout.log('mariadbd')}"],
                   layout.log("mariadbd-stdout"), layout.pid_file("mariadbd"))
    wait_until(lambda: subprocess.run(["mariadb-admin", "--no-defaults", "-S", str(layout.mysql_socket),
                                       "--silent", "ping"], capture_output=True).returncode == 0,
               60, "mariadbd", layout.log("mariadbd"))
    _mysql(layout, f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}'; "
                   f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';")


def _start_slurmdbd(layout: SlurmLayout) -> None:
    run(["slurmdbd"], env=layout.env)
    wait_until(lambda: port_open(layout.base_port + 2), 30, "slurmdbd", layout.log("slurmdbd"))


def _node_states(layout: SlurmLayout) -> dict[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=layout.env)
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def _start_slurmctld(layout: SlurmLayout) -> None:
    run(["slurmctld"], env=layout.env)


def _start_slurmd(layout: SlurmLayout, node: str) -> None:
    argv = ["slurmd", "-N", node]
    run(argv if layout.network is None else layout.network.on_node(node, argv), env=layout.env)


STARTERS = {"munged": _start_munged, "mariadbd": _start_mariadbd, "slurmdbd": _start_slurmdbd,
            "slurmctld": _start_slurmctld}


def _start(layout: SlurmLayout, daemon: str) -> None:
    if daemon in layout.slurmds:
        _start_slurmd(layout, layout.slurmds[daemon])
    else:
        STARTERS[daemon](layout)


def _slurmd_pid_files(layout: SlurmLayout) -> list[Path]:
    """Those of any node count this stack ever had, so a changed count leaves no slurmd behind."""
    run_dir = layout.root / "run"
    return [*run_dir.glob("slurmd.pid"), *sorted(run_dir.glob("slurmd@*.pid"))]


def _ensure_network(layout: SlurmLayout) -> None:
    """The nodes' namespaces as this layout wants them. Running slurmds keep theirs when it is
    whole; otherwise (a crashed stack's leftovers, another node count) every slurmd stops and the
    network is built anew."""
    net = layout.network
    if net is None:
        nodes.remove(nodes.name_prefix(layout.base_port))  # what an earlier `--nodes N` left
        return
    if nodes.present(net) and any(running_pid(layout.pid_file(d)) for d in layout.slurmds):
        return
    for pid_file in _slurmd_pid_files(layout):
        stop(pid_file)
    nodes.remove(net.prefix)
    nodes.create(net)


def up(layout: SlurmLayout) -> dict[str, int]:
    if not installed():
        raise StackError("Slurm is not installed here: run `make system-deps` as root "
                         "(deployments/stack/install-debian.sh installs Debian's slurmctld slurmd "
                         "slurm-client munge slurmdbd mariadb-server)")
    if os.geteuid() != 0:
        raise StackError("the local Slurm cluster runs its daemons as root; run as root")
    if write_config(layout):
        # A stack started by an older checkout runs on the old settings: slurmd reads its node's
        # generic resources only at start. Running jobs outlive both daemons' restarts.
        for pid_file in (*_slurmd_pid_files(layout), layout.pid_file("slurmctld")):
            stop(pid_file)
    _ensure_network(layout)
    for daemon in layout.daemons:
        if running_pid(layout.pid_file(daemon)) is None:
            _start(layout, daemon)
    _wait_idle(layout)
    return status(layout)


def _wait_idle(layout: SlurmLayout) -> None:
    log = layout.log("slurmctld")
    wanted = set(layout.slurmds.values())

    def ready() -> bool:
        states = _node_states(layout)
        return all(states.get(node, "").rstrip("*") in ("idle", "mix", "alloc") for node in wanted)

    try:
        wait_until(ready, 15, "the Slurm nodes", log)
    except StackError:
        # A DRAIN reason saved before a crash survives restarts, and ReturnToService=2 does not
        # clear one set for an invalid registration (docs/local-stack.md, "Slurm settings").
        subprocess.run(["scontrol", "update", f"nodename={','.join(sorted(wanted))}", "state=resume"],
                       capture_output=True, env=layout.env)
        wait_until(ready, 30, f"the Slurm nodes (states {_node_states(layout)!r})", log)


def cancel_all_jobs(layout: SlurmLayout) -> None:
    if running_pid(layout.pid_file("slurmctld")) is None:
        return
    ids = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         env=layout.env).stdout.split()
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, env=layout.env)
        wait_until(lambda: not subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True,
                                              text=True, env=layout.env).stdout.split(),
                   60, "cancelling the remaining jobs", layout.log("slurmctld"))


def down(layout: SlurmLayout) -> list[str]:
    cancel_all_jobs(layout)
    stopped = [d for d in reversed(layout.daemons) if stop(layout.pid_file(d))]
    nodes.remove(nodes.name_prefix(layout.base_port))
    return stopped


def drop_accounting(layout: SlurmLayout) -> None:
    """Wipe controller state and accounting together: job ids restart at 1, and no old
    accounting row can answer for a new job with the same id."""
    shutil.rmtree(layout.root / "state", ignore_errors=True)
    shutil.rmtree(layout.root / "spool", ignore_errors=True)
    for daemon in ("munged", "mariadbd"):
        if running_pid(layout.pid_file(daemon)) is None:
            STARTERS[daemon](layout)
    _mysql(layout, f"DROP DATABASE IF EXISTS {DB_NAME};")


def status(layout: SlurmLayout) -> dict[str, int | None]:
    return {d: running_pid(layout.pid_file(d)) for d in layout.daemons}
