"""The NxD Training and Megatron-LM train tasks on the real local Slurm cluster, as the pretrain
flow calls them, as far as this machine lets them go. Each task renders its launch (NxDT's
train.sh and conf, Megatron-LM's torchrun line), submits its job and follows it; the job runs on
the cluster's node, which has neither trainer, and stops there before its torchrun line: the
node script's own check finds no NxDT orchestrator, no pretrain_gpt.py, and says so. Nothing
stands in for either trainer.

A missing program is not worth a second job: the task fails at once naming it, the job it
submitted is the only one (the run's chain and Slurm's accounting agree), and Prefect does not
retry the task either (a retry would continue the same chain). Neither task reads its inputs on
this side before submitting, so the dataset paths given are where the tokenize stage would have
put them."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest
from prefect import flow

from blocks.cluster import SlurmCluster
from pretrain import run_chain
from pretrain.log_parsers import rank_error
from pretrain.presets import load_spec
from tests.model_that_fits import MODEL_THAT_FITS
from render.megatron_lm import PRETRAIN_GPT
from tasks.attempts import TrainingFailed
from tasks.train_megatron import train_megatron
from tasks.train_nxdt import train_nxdt

BLOCK = "shared-local-node"
MISSING = "torchrun: command not found"  # bash's words for a node without PyTorch


@pytest.fixture
def local_node(local_stack) -> str:
    """The cluster block of a site whose jobs share nodes (the suite's other jobs run beside them
    on the one local node) and whose GPUs, if any, Slurm does not schedule as a generic resource
    (the local node has none to ask for)."""
    SlurmCluster(executor="slurm", exclusive=False, gres="none").save(BLOCK, overwrite=True)
    return BLOCK


@flow
def train_stage(task, spec, *inputs):
    """The train stage as the pretrain flow runs it: the task with its own retry options."""
    return task(spec, *inputs)


def job_names(name: str, timeout_s: float = 60) -> list[str]:
    """The ids of the jobs of this name in Slurm's accounting, once it lists any: slurmctld hands
    a job's records to slurmdbd on its own schedule, which lags behind the job's end on a busy
    machine (the task may have seen the end through squeue while sacct could not answer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-S", "now-1hours", "--name", name, "-o", "JobID"],
                             capture_output=True, text=True)
        if (out.returncode == 0 and out.stdout.split()) or time.monotonic() > deadline:
            return out.stdout.split()
        time.sleep(1)


def run_until_a_program_is_missing(task, spec, program: str, *inputs) -> Path:
    """Runs the train stage to its failure, checks the failure and the run's one job; the run's directory."""
    with pytest.raises(TrainingFailed) as info:
        train_stage(task, spec, *inputs)
    (run,) = (Path(spec.paths.root) / "train").iterdir()
    chain = run_chain.read(run / run_chain.CHAIN_FILE)
    assert len(chain) == 1, f"jobs {[r['job'] for r in chain]} were submitted: one was resubmitted, or retried"
    (record,) = chain
    job, name = record["job"], f"{spec.name}-train"
    assert job_names(name) == [job]
    failure = str(info.value)
    # the reason names the job and why it was not resubmitted: the program was not found (127)
    assert failure.startswith(f"not resubmitted: job {job} ({name}) ended FAILED")
    assert failure.split(". Attempts: ")[0].endswith("failed with exit code 127")
    # the attempt names the program, from the node's log
    assert record["outcome"].startswith("FAILED: ") and f" -- no program at {program}: " in record["outcome"]
    assert failure.endswith(f". Attempts: job {job}: {record['outcome']}")
    assert [a["outcome"] for a in info.value.attempts] == [record["outcome"]]
    assert (record["checkpoint_before"], record["checkpoint_after"], record["completed"]) == (0, 0, False)
    return run


def node_name() -> str:
    return subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, check=True).stdout.strip()


def test_nxdt_training_runs_its_train_sh_on_the_node_and_stops_at_the_missing_orchestrator(
        local_node, tmp_path, clean_queue):
    # the tutorial's one-node GPT preset; cpus_per_task: the local node has 2 CPUs, not a trn1's 128
    spec = load_spec("megatron-gpt-6.7b", [*MODEL_THAT_FITS, f"paths.root={tmp_path}", f"cluster.block={local_node}",
                                           "cluster.time_limit_min=5", "cluster.startup_min=1",
                                           "backend.neuron.save_before_limit_s=60", "cluster.cpus_per_task=1",
                                           f"name=nxdt-{uuid.uuid4().hex[:8]}"])
    clean_queue.append(f"{spec.name}-train")
    orchestrator = str(Path(spec.backend.neuron.examples_dir.replace("~", str(Path.home()), 1))
                       / "training_orchestrator.py")
    run = run_until_a_program_is_missing(train_nxdt, spec, orchestrator, str(tmp_path / "data" / "my-gpt2_text_document"))

    # train.sh ran on the node up to its launch: the node's directory, its host name, the links
    # to NxDT's orchestrator and the rendered conf, and the check's words in the node's log
    node_dir = run / "node-0"
    assert (node_dir / "host").read_text().strip() == node_name()
    assert (node_dir / "conf").resolve() == run / "conf" and (run / "conf" / "nxdt_config.yaml").is_file()
    assert str((node_dir / "training_orchestrator.py").readlink()) == orchestrator
    log = (node_dir / "train.log").read_text()
    assert log.startswith(f"pretrain: no program at {orchestrator}: backend.neuron.examples_dir") and log.count("\n") == 1


def test_megatron_lm_runs_its_torchrun_line_on_the_node_and_stops_at_the_missing_pretrain_gpt(
        local_node, tmp_path, clean_queue):
    # the runbooks' GPT-3 7.5B on the one local node, one rank: no tensor parallelism across 8 GPUs
    spec = load_spec("gpt3-7.5b-gpu", [*MODEL_THAT_FITS, f"paths.root={tmp_path}", f"cluster.block={local_node}",
                                       "cluster.nodes=1", "cluster.devices_per_node=1", "cluster.cpus_per_task=1",
                                       "parallel.tp=1", "parallel.sequence_parallel=false",
                                       "cluster.time_limit_min=5", "cluster.startup_min=1",
                                       "backend.megatron_lm.save_before_limit_s=60",
                                       f"name=megatron-{uuid.uuid4().hex[:8]}"])
    clean_queue.append(f"{spec.name}-train")
    # no image: the image stage's squashfs would run the job in a pyxis container, which this
    # cluster has not; the job runs on the node as it is
    run = run_until_a_program_is_missing(train_megatron, spec, PRETRAIN_GPT,
                                         str(tmp_path / "data" / "oscar_text_document"))
    assert (run / "node-0.log").read_text().startswith(f"pretrain: no program at {PRETRAIN_GPT}: the job runs in an image")


@pytest.mark.pure
def test_a_program_the_node_lacks_is_the_attempts_reason():
    """What bash and Python print when the program or the script they are to run is missing, as
    a node without PyTorch and a node with PyTorch but without Megatron-LM printed them, and the
    node scripts' own check before their launch (render/shell.py)."""
    assert rank_error("/fsx/train/train.sh: line 35: torchrun: command not found\n") == MISSING
    assert rank_error("bash: line 1: torchrun: command not found") == MISSING
    assert rank_error("/work/main/.venv/bin/python: can't open file '/workspace/Megatron-LM/pretrain_gpt.py': "
                      "[Errno 2] No such file or directory") == (
        "can't open file '/workspace/Megatron-LM/pretrain_gpt.py': [Errno 2] No such file or directory")
    assert rank_error("pretrain: no program at /fsx/nxdt/examples/training_orchestrator.py: backend.neuron.examples_dir "
                      "names ...") == ("no program at /fsx/nxdt/examples/training_orchestrator.py: "
                                       "backend.neuron.examples_dir names ...")
    assert rank_error("warning: the command not found in the cache is compiled") is None
