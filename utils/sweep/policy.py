"""One failure policy for every sweep: what the sweep does with a job that ended without a
measurement, decided from triage's failure class (docs/sweep.md "Failure policy").

decide() is the only place the policy lives; the sweep kinds apply its action and record the
decision (with its evidence) in the record's `decisions`.
"""

from __future__ import annotations

from collections.abc import Sequence

# action -> what the sweep does
SKIP_VALUE = "skip_value"  # out of memory: do not run this value (and larger ones in batch)
EXCLUDE_NODE_RETRY = "exclude_node_retry"  # one node is bad: rerun once without it
RETRY = "retry"  # hang / timeout: cancelled, rerun once
MARK_FAILED = "mark_failed"  # keep the failure, go on with the sweep
STOP = "stop"  # the failure would repeat on every job: stop the sweep

# failure class -> (action, why); a class not listed is MARK_FAILED
POLICY: dict[str, tuple[str, str]] = {
    "oom_device": (SKIP_VALUE, "out of GPU memory: this value does not fit"),
    "oom_host": (SKIP_VALUE, "out of host memory: this value does not fit"),
    "gpu_health": (EXCLUDE_NODE_RETRY, "one node failed the GPU check: exclude it, retry once"),
    "gpu_error": (EXCLUDE_NODE_RETRY, "a GPU failed on one node: exclude it, retry once"),
    "node_failure": (EXCLUDE_NODE_RETRY, "one node failed: exclude it, retry once"),
    "config_error": (STOP, "the config does not load: every job would fail the same way"),
    "hang": (RETRY, "the job hung: cancelled, retry once"),
    "no_steps": (MARK_FAILED, "no step line reached the log: nothing measured, kept as a failure to look at"),
}
TIMEOUT = "timeout"  # a job the sweep cancelled at --timeout is treated as a hang


def decide(
    status: str,
    failure_class: str | None,
    culprits: Sequence[str] = (),
    retried: bool = False,
    earlier_classes: Sequence[str | None] = (),
) -> dict:
    """The sweep's action for one ended job.

    status/failure_class/culprits: the job's triage result; retried: the job is already a retry;
    earlier_classes: the failure class (else the status) of each of the sweep's other ended jobs,
    empty once any job completed: the same failure on every job stops the sweep. Returns {action, reason}.
    """
    if status == "completed":
        return {"action": "keep", "reason": "completed"}
    cls = "hang" if status == TIMEOUT else failure_class
    action, why = POLICY.get(cls or "", (MARK_FAILED, f"failed ({cls or status}): kept as a failure"))
    if action == EXCLUDE_NODE_RETRY and len(culprits) != 1:
        action, why = MARK_FAILED, f"{cls} without exactly one culprit node ({len(culprits)}): kept as a failure"
    if action in (EXCLUDE_NODE_RETRY, RETRY) and retried:
        action, why = MARK_FAILED, f"{cls} again on the retry: kept as a failure"
    same = cls or status  # a job without a class (submit_failed, unknown) compares by its status
    if action not in (STOP, SKIP_VALUE) and earlier_classes and all(c == same for c in earlier_classes):
        # (larger values running out of memory too is expected, not a broken setup)
        action, why = STOP, f"every job so far failed the same way ({same}, {len(earlier_classes) + 1} jobs)"
    return {"action": action, "reason": why}


def candidate_only_failures(baseline: dict[str, bool], candidate: dict[str, bool]) -> list[str]:
    """Models that completed on the baseline commit but failed on the candidate
    (name -> completed). Two or more stop a `models --commits` sweep early."""
    return sorted(m for m, ok in candidate.items() if not ok and baseline.get(m) is True)


def table() -> list[tuple[str, str, str]]:
    """(class, action, why) rows of the policy, for docs and tests."""
    return [(c, a, w) for c, (a, w) in POLICY.items()]
