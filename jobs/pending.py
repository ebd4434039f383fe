"""Why a job waits in the queue, and whether Slurm will ever start it.

Slurm gives a pending job one reason at a time (https://slurm.schedmd.com/job_reason_codes.html).
Some only mean waiting: the nodes are busy (``Resources``), other jobs go first (``Priority``), the
partition is down for now (``PartitionDown``), an aggregate limit of the account is reached until
its other jobs end (``AssocGrp*``, ``QOSGrp*``). Others say the request itself is beyond what the
partition, the association or the QOS allows, or names nodes that are out of service: such a job
waits for ever, so the follow loop cancels it and fails with the reason and the fix.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from typing import Callable

from jobs.nodes import expand_nodes, unhealthy_nodes

# How often a job that is only waiting says so in the task log.
WAITING_LOG_EVERY_S = 180.0
# How often squeue is asked for a pending job's reason: Slurm re-evaluates it at each scheduling
# pass, and an array of many pending tasks must not cost a squeue call each per poll.
REASON_CHECK_EVERY_S = 10.0

# Reasons that no amount of waiting satisfies, each with what to change (job_reason_codes.html).
NEVER_SATISFIED = {
    "PartitionNodeLimit": "the job asks for more nodes than its partition allows or has (or the nodes it needs "
                          "are down or drained): lower cluster.nodes, or choose a partition with enough nodes",
    "PartitionTimeLimit": "the time limit is above the partition's MaxTime: lower cluster.time_limit_min",
    "PartitionConfig": "the partition cannot give what the job asks for (nodes, CPUs, memory, GRES): check the "
                       "partition with `scontrol show partition`, or choose another in the cluster block",
    "AccountNotAllowed": "the account may not use this partition: set the cluster block's account or partition",
    "InvalidAccount": "the account does not exist or is not valid: set the cluster block's account",
    "InvalidQOS": "the QOS does not exist or is not the job's: set the cluster block's qos",
    "QOSNotAllowed": "the QOS may not be used here: set the cluster block's qos",
    "BadConstraints": "the job's constraints cannot be satisfied by any node: check the cluster block's sbatch_options",
    "DependencyNeverSatisfied": "a job it depends on failed",
}
# A limit of the association or the QOS on one job (or one node of it), as opposed to their
# aggregate limits (Grp*, per user, per account), which are freed when other jobs end.
PER_JOB_LIMIT = re.compile(r"^(Assoc|QOS)Max\w*Per(Job|Node)")
UNAVAILABLE_NODES = re.compile(r"UnavailableNodes:(\S+)")


def out_of_service(nodes: str) -> bool:
    """Whether every node of the Slurm node list ``nodes`` is down, drained, failing or not responding."""
    hosts = expand_nodes(nodes)
    return bool(hosts) and unhealthy_nodes(hosts) >= set(hosts)


def never_runs(reason: str, all_out_of_service: Callable[[str], bool] = out_of_service) -> str | None:
    """What to change when ``reason`` (squeue's ``%r``) means the job will never start; None when
    it only waits. ``ReqNodeNotAvail`` is final only when every node it names is out of service:
    Slurm also gives it while a long backfill cycle holds nodes (reframe-hpc/reframe#1049)."""
    code = reason.split(",")[0].strip()
    if code in NEVER_SATISFIED:
        return NEVER_SATISFIED[code]
    if PER_JOB_LIMIT.match(code):
        return ("the job exceeds a per-job limit of its association or QOS (`sacctmgr show assoc` / "
                "`sacctmgr show qos` list them): ask for less (cluster.nodes, devices, time) or use another qos")
    if code == "ReqNodeNotAvail" and (listed := UNAVAILABLE_NODES.search(reason)):
        if all_out_of_service(listed.group(1)):
            return (f"the nodes it needs are down or drained ({listed.group(1)}): take them out of the cluster "
                    "block's nodelist, or have them resumed (`scontrol update nodename=... state=resume`)")
    return None


def queue_reason(job_id: str) -> str | None:
    """squeue's reason for a job that is pending now; None once it is not."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True, timeout=60)
    state, _, reason = out.stdout.strip().partition("|")
    return reason if out.returncode == 0 and state == "PENDING" else None


class QueueWatch:
    """Follows one job while Slurm keeps it pending: logs its reason and how long it has waited
    every :data:`WAITING_LOG_EVERY_S`, and says when the reason means it never starts."""

    def __init__(self, job_id: str, name: str, logger: logging.Logger | logging.LoggerAdapter,
                 clock: Callable[[], float] = time.monotonic):
        self.job_id, self.name, self.logger, self.clock = job_id, name, logger, clock
        self.since: float | None = None  # when this stretch in the queue began (a requeue starts another)
        self.logged = 0.0
        self.checked: float | None = None

    def pending(self) -> str | None:
        """Called at each poll while accounting says PENDING: the failure's detail when the job will
        never start, else None."""
        now = self.clock()
        if self.checked is not None and now - self.checked < REASON_CHECK_EVERY_S:
            return None
        self.checked = now
        reason = queue_reason(self.job_id)
        if reason is None:
            self.since = None
            return None
        if self.since is None:
            self.since, self.logged = now, now
        if (fix := never_runs(reason)) is not None:
            return f"pending with reason {reason}, which Slurm will never satisfy: {fix}"
        if now - self.logged >= WAITING_LOG_EVERY_S:
            self.logged = now
            self.logger.info("job %s (%s) has waited %.0f min in the queue: %s", self.job_id, self.name,
                             (now - self.since) / 60, reason)
        return None
