"""``python -m jobs.lease LEASE TIMEOUT_S -- PROGRAM [ARGS...]``: a Kubernetes pod's program under
the job layer's lease, the rule of :class:`jobs.node.Leased` that Slurm jobs follow. The flow
process that created the job renews LEASE, on the shared volume every pod mounts, while it follows
the job; should it die without deleting the job (its pod killed, its node lost), the lease goes
stale and every pod stops its program and fails, and with them the job (backoffLimit 0), as a
Slurm job cancels itself. Runs in the pod, so it imports nothing of the control plane.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from jobs.node import Leased


def run(argv: list[str]) -> int:
    """The program's exit code; the lease's interrupt stops it first."""
    proc = subprocess.Popen(argv)
    # Kubernetes stops a pod by signalling its first process, this one: the program must get
    # SIGTERM itself, to save a checkpoint on its way out.
    signal.signal(signal.SIGTERM, lambda signum, _: proc.send_signal(signum))
    try:
        return proc.wait()
    except KeyboardInterrupt:  # the lease expired (Leased interrupts this process)
        proc.terminate()
        proc.wait()
        return 1


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        raise SystemExit("usage: python -m jobs.lease LEASE TIMEOUT_S -- PROGRAM [ARGS...]")
    lease, timeout_s, _, *argv = args
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not inherited ignored
    return Leased(lambda: run(argv), lease, float(timeout_s))()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
