"""Nothing is lost beyond the last complete checkpoint (issue 9): a signal to the launcher, the
launcher killed outright, a non-finite loss, a bad option found late; each time every rank stops,
the exit is non-zero, and `--resume` continues from the last complete checkpoint. (A killed rank:
test_dist_failure.py and test_dist_launcher.py; a power loss mid-write:
tests/unit/test_checkpoint_integrity.py.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from disthelpers import make_plan, pipeline, train

from hetpp.cli.main import main
from hetpp.runtime import checkpoint
from hetpp.runtime.checkpoint_meta import check_resumable
from hetpp.runtime.options import TrainOptions
from hetpp.runtime.preflight import check_run
from hetpp.specs.plan import load_plan

pytestmark = pytest.mark.dist
HETPP = [sys.executable, "-m", "hetpp.cli.main"]


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the launcher's ranks)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout_s} s")
        time.sleep(0.05)


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    plan = make_plan("tiny-gpt", [pipeline([0, 1], [0, 3, 6], 2, 2)])
    plan.save(tmp_path / "plan.json")
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    argv = ["train", "--plan", str(tmp_path / "plan.json"), "--steps", "100000",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--metrics", str(metrics),
            "--timeout-s", "30"]  # fmt: skip
    proc = subprocess.Popen([*HETPP, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = lambda: len(metrics.read_text().splitlines()) if metrics.exists() else 0  # noqa: E731
    # Step 3's line is logged after step 2's checkpoint is complete.
    _wait(lambda: lines() >= 3 or proc.poll() is not None, 90, "fewer than 3 steps")
    assert proc.poll() is None, proc.stderr.read().decode()
    return proc, ckpt, tmp_path / "plan.json"


# A rank killed under the launcher: tests/dist/test_dist_launcher.py and test_dist_failure.py.
@pytest.mark.parametrize("target", ["launcher-sigterm", "launcher-sigkill"])
def test_a_stopped_run_loses_nothing_beyond_the_last_checkpoint(target, tmp_path):
    proc, ckpt, plan = _start(tmp_path)
    ranks = _children(proc.pid)
    assert len(ranks) == 2
    try:
        if target == "launcher-sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.kill()
        rc = proc.wait(timeout=60)
        _wait(lambda: not any(_alive(r) for r in ranks), 30, "ranks still running")
    finally:
        for r in ranks:
            if _alive(r):
                os.kill(r, signal.SIGKILL)
    err = proc.stderr.read().decode()
    assert rc != 0, err
    if target == "launcher-sigterm":
        assert rc == 128 + signal.SIGTERM and "SIGTERM: stopping every rank" in err, err
    done = checkpoint.latest(ckpt)
    assert done is not None
    step = checkpoint.read_meta(done).step
    # --resume continues from it (forked ranks: no second torch import).
    records = train(
        load_plan(plan), tmp_path, steps=step + 1, checkpoint_dir=str(ckpt), resume=True
    )
    assert [r.step for r in records[0].records] == [step + 1]
    assert checkpoint.read_meta(checkpoint.latest(ckpt)).step == step + 1


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_checkpoint(tmp_path):
    plan = make_plan("tiny-gpt", [pipeline([0], [0, 3, 6][::2], 2, 1), pipeline([1], [0, 6], 2, 1)])
    ckpt = tmp_path / "ckpt"
    opts = {"steps": 6, "optimizer": "sgd", "lr": 1e30, "checkpoint_dir": str(ckpt),
            "checkpoint_every": 1}  # fmt: skip
    with pytest.raises(AssertionError, match=r"NonFiniteError: step (\d): loss nan") as e:
        train(plan, tmp_path, **opts)
    bad = int(re.search(r"NonFiniteError: step (\d)", str(e.value)).group(1))
    assert checkpoint.read_meta(checkpoint.latest(ckpt)).step == bad - 1
    assert not list(ckpt.glob(".tmp-*")) or bad == 1


def test_resume_without_a_checkpoint_is_a_notice(tmp_path):
    plan = make_plan("tiny-gpt", [pipeline([0], [0, 6], 2, 1)])
    empty = tmp_path / "empty"
    opts = TrainOptions(plan="p.json", checkpoint_dir=str(empty), resume=True)
    notices = check_run(opts, plan)
    assert notices == [f"--resume: no complete checkpoint in {empty}; starting at step 0"]


def test_a_broken_checkpoint_is_one_message_from_the_launcher(tmp_path, capfd):
    plan = make_plan("tiny-gpt", [pipeline([0, 1], [0, 3, 6], 2, 2)])
    plan.save(tmp_path / "plan.json")
    step = tmp_path / "ckpt" / "step_00000003"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("ok\n")
    (step / "meta.json").write_text('{"step": 3, "samples": ')
    argv = ["train", "--plan", str(tmp_path / "plan.json"), "--checkpoint-dir",
            str(tmp_path / "ckpt"), "--resume"]  # fmt: skip
    assert main(argv) == 2
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{step / 'meta.json'}: cannot parse" in err, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A plan and a checkpoint directory after two steps of it."""
    tmp = tmp_path_factory.mktemp("trained")
    plan = make_plan("tiny-gpt", [pipeline([0], [0, 6], 2, 1)])
    train(plan, tmp, steps=2, checkpoint_dir=str(tmp / "ckpt"))
    return plan, tmp / "ckpt"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--metrics", "{dir}"], "--metrics: is a directory"),
        (["--optimizer", "sgd"], "resume with the same"),
        (["--seed", "3"], "resume with the same"),
        (["--data", "{empty}"], "--data"),
    ],
)
def test_a_bad_option_found_late_leaves_the_checkpoint(extra, words, trained, tmp_path, capfd):
    """Options that used to fail in the ranks (or after training) are refused before any rank
    starts; the checkpoint stays complete and a correct --resume continues from it."""
    plan, ckpt = trained[0], tmp_path / "ckpt"
    shutil.copytree(trained[1], ckpt)
    before = checkpoint.latest(ckpt)
    plan.save(tmp_path / "plan.json")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "empty.bin").write_bytes(b"")
    subs = {"{dir}": str(tmp_path / "a-dir"), "{empty}": str(tmp_path / "empty.bin")}
    argv = ["train", "--plan", str(tmp_path / "plan.json"), "--steps", "4", "--checkpoint-dir",
            str(ckpt), "--resume", *(subs.get(a, a) for a in extra)]  # fmt: skip
    capfd.readouterr()
    assert main(argv) == 2
    assert words in capfd.readouterr().err
    assert checkpoint.latest(ckpt) == before
    assert check_resumable(before, plan.model.model_dump(mode="json"), "adamw", 0).step == 2
