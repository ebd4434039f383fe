"""torchtitan's step lines, as a node log grows, into the train stage's metrics stream: the
follower the attempt loop polls (tasks/attempts.py) reading real lines from public torchtitan runs
(tests/assets/logs/torchtitan-public-lines.txt, each block under its source)."""

from __future__ import annotations

import pytest

from pretrain.presets import load_spec
from tasks.attempts import MetricsFollower
from tests.public_logs import blocks

pytestmark = pytest.mark.pure


def test_the_followed_node_log_turns_torchtitan_step_lines_into_the_loss_curve(tmp_path):
    source, lines = next(b for b in blocks("torchtitan-public-lines.txt") if b[0].endswith("/pull/3393"))
    log = tmp_path / "node-0.log"
    follower = MetricsFollower(load_spec("llama3-8b-gpu"), log, total_steps=14, hang_timeout_s=60)
    follower.read()  # queued: no log yet
    with open(log, "w") as out:
        out.write(lines[0][:50])  # torchrun's tee has flushed half a line
        out.flush()
        follower.read()
        assert follower.stream.as_list() == []
        out.write(lines[0][50:] + "\n")
        out.flush()
        follower.read()
    (point,) = follower.stream.as_list()
    assert (point["step"], point["loss"], point["grad_norm"], point["tokens_per_s_per_device"], point["mfu_pct"],
            point["memory_gib"], point["rank"]) == (14, 3.24405, 0.8319, 7282.0, 0.17, 9.46, 0.0), source
