"""utils/launch/run_stage.sh: every line a stage prints reaches the log at once, with its node's
prefix, while the stage still runs (a hung trainer's last lines are what triage reads)."""

import os
import subprocess
import time

from conftest import REPO

from helpers.jobs import wait_for


def test_a_line_reaches_the_log_while_the_stage_still_runs(tmp_path):
    out = tmp_path / "log"
    env = {**os.environ, "JOB_DIR": str(tmp_path / "job"), "JOB_HOSTNAME": "node3"}
    with out.open("w") as f:
        stage = subprocess.Popen(
            [str(REPO / "utils/launch/run_stage.sh"), "train", "300", "bash", "-c", "echo step 7; sleep 120"],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        wait_for(lambda: "node3: step 7\n" in out.read_text(), 60, "the line in the log")
        # buffered, it would come only when the command ends (120 s)
        assert stage.poll() is None and time.monotonic() - started < 60
    finally:
        stage.terminate()
        stage.wait(timeout=30)
    assert (tmp_path / "job/.stages/train/node3").read_text().startswith("rc=143 end=")
