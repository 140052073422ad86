"""Hostile inputs end in one line naming the file and field, exit 2, no traceback (issue 9).

Structure and encoding cases run through every reader (cluster YAML, model YAML and JSON, plan
JSON, profile CSV) and the commands that read them; value and size cases through `check` and the
command that would expand them. Memory stays bounded by construction (sizes are checked before
anything is built); `test_size_cases_fit_in_bounded_memory` runs the size cases again in a
process whose address space is capped, so a regression that expands first fails there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import hostile_cases as hc
import pytest

from hetpp.cli.main import main


def _write(tmp_path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def _expect_one_line(argv: list[str], words: tuple[str, ...], capsys) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    err = out.err.strip()
    assert rc == 2, f"exit {rc}: {err}\n{out.out[-500:]}"
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def _good(tmp_path) -> dict[str, str]:
    return {
        "cluster": _write(tmp_path, "good-cluster.yaml", hc.GOOD_CLUSTER),
        "plan": _write(tmp_path, "good-plan.json", json.dumps(hc.good_plan())),
    }


YAML_READERS = {
    "check-cluster": ["check", "--cluster", "{f}"],
    "plan-cluster": ["plan", "--cluster", "{f}", "--model", "tiny-gpt", "--global-batch", "4"],
    "check-model": ["check", "--model", "{f}"],
}
JSON_READERS = {
    "estimate": ["estimate", "{f}"],
    "simulate": ["simulate", "{f}"],
    "train": ["train", "--plan", "{f}"],
    "check-hf": ["check", "--model", "{f}"],
}


def _argv(template: list[str], f: str) -> list[str]:
    return [a.replace("{f}", f) for a in template]


STRUCTURE_CASES = [
    (case, reader, suffix)
    for cases, readers, suffix in (
        (hc.STRUCTURE, YAML_READERS, ".yaml"),
        (hc.JSON_STRUCTURE, JSON_READERS, ".json"),
    )
    for case in cases
    for reader in readers
]


@pytest.mark.parametrize(("case", "reader", "suffix"), STRUCTURE_CASES)
def test_file_structure(case, reader, suffix, tmp_path, capsys):
    content, words = {**hc.STRUCTURE, **hc.JSON_STRUCTURE}[case]
    f = _write(tmp_path, case + suffix, content)
    readers = YAML_READERS if suffix == ".yaml" else JSON_READERS
    _expect_one_line(_argv(readers[reader], f), (f, words), capsys)


@pytest.mark.parametrize("case", hc.CLUSTER_VALUES)
def test_cluster_values(case, tmp_path, capsys):
    content, words = hc.CLUSTER_VALUES[case]
    f = _write(tmp_path, f"{case}.yaml", content)
    _expect_one_line(["check", "--cluster", f], (f, words), capsys)


@pytest.mark.parametrize("case", hc.MODEL_VALUES)
def test_model_values(case, tmp_path, capsys):
    content, words = hc.MODEL_VALUES[case]
    f = _write(tmp_path, f"{case}.yaml", content)
    _expect_one_line(["check", "--model", f], (f, words), capsys)


@pytest.mark.parametrize("case", hc.HF_FILES)
def test_hf_config_files(case, tmp_path, capsys):
    content, words = hc.HF_FILES[case]
    f = _write(tmp_path, case, content)
    _expect_one_line(["check", "--model", f], (f, words), capsys)


@pytest.mark.parametrize("command", ["check", "estimate"])
@pytest.mark.parametrize("case", hc.PLAN_VALUES)
def test_plan_values(case, command, tmp_path, capsys):
    content, words = hc.PLAN_VALUES[case]
    f = _write(tmp_path, f"{case}.json", content)
    argv = ["check", "--plan", f] if command == "check" else ["estimate", f]
    _expect_one_line(argv, (f, words), capsys)


@pytest.mark.parametrize("case", hc.PLAN_SIZES)
def test_plan_sizes(case, tmp_path, capsys):
    content, words = hc.PLAN_SIZES[case]
    f = _write(tmp_path, f"{case}.json", content)
    _expect_one_line(["simulate", f, "--json"], (f, words), capsys)


@pytest.mark.parametrize("case", hc.PROFILE_VALUES)
def test_profile_values(case, tmp_path, capsys):
    content, words = hc.PROFILE_VALUES[case]
    f = _write(tmp_path, f"{case}.csv", content)
    _expect_one_line(["check", "--profile", f], (f, words), capsys)


def test_a_nan_profile_is_refused_where_it_is_used(tmp_path, capsys):
    """It used to be accepted and its GPU type quietly left to the estimator."""
    content, _ = hc.PROFILE_VALUES["fwd-nan"]
    f = _write(tmp_path, "nan.csv", content)
    good = _good(tmp_path)
    _expect_one_line(["simulate", good["plan"], "--profile", f], (f, "line 2"), capsys)


PLAN_ARGS = ["plan", "--cluster", "{cluster}", "--model", "tiny-gpt", "--seq-len", "32"]
OPTIONS = {
    "plan-seq-negative": ([*PLAN_ARGS[:-2], "--global-batch", "4", "--seq-len", "-1"],
                          "argument --seq-len: expected a positive integer"),
    "plan-seq-zero": ([*PLAN_ARGS[:-2], "--global-batch", "4", "--seq-len", "0"],
                      "argument --seq-len"),
    "plan-seq-word": ([*PLAN_ARGS[:-2], "--global-batch", "4", "--seq-len", "long"],
                      "argument --seq-len"),
    "plan-batch-zero": ([*PLAN_ARGS, "--global-batch", "0"], "argument --global-batch"),
    "plan-batch-float": ([*PLAN_ARGS, "--global-batch", "1e3"], "argument --global-batch"),
    "plan-batch-1e17": ([*PLAN_ARGS, "--global-batch", str(10 ** 17)], "global_batch"),
    "plan-reserve-negative": ([*PLAN_ARGS, "--global-batch", "4", "--reserve-gb", "-1"],
                              "argument --reserve-gb"),
    "plan-reserve-nan": ([*PLAN_ARGS, "--global-batch", "4", "--reserve-gb", "nan"],
                         "argument --reserve-gb"),
    "plan-reserve-inf": ([*PLAN_ARGS, "--global-batch", "4", "--reserve-gb", "inf"],
                         "argument --reserve-gb"),
    "plan-mbs-zero": ([*PLAN_ARGS, "--global-batch", "4", "--micro-batch-sizes", "0,1"],
                      "argument --micro-batch-sizes"),
    "plan-seq-beyond-model": ([*PLAN_ARGS[:-2], "--global-batch", "4", "--seq-len", "4096"],
                              "--seq-len: 4096 exceeds"),
    "compare-reserve-nan": (["compare", "--cluster", "{cluster}", "--model", "tiny-gpt",
                             "--global-batch", "4", "--reserve-gb", "nan"], "--reserve-gb"),
    "check-seq-zero": (["check", "--model", "tiny-gpt", "--seq-len", "0"], "argument --seq-len"),
    "demo-steps-zero": (["demo", "--steps", "0"], "argument --steps"),
    "demo-steps-word": (["demo", "--steps", "many"], "argument --steps"),
    "profile-repeats-zero": (["profile", "--model", "tiny-gpt", "--repeats", "0", "--out", "x.csv"],
                             "argument --repeats"),
    "profile-seq-negative": (["profile", "--model", "tiny-gpt", "--seq-len", "-4",
                              "--out", "x.csv"], "argument --seq-len"),
    "profile-mbs-too-big": (["profile", "--model", "tiny-gpt", "--micro-batch-sizes", "10000000",
                             "--out", "x.csv"], "micro-batch size 10000000 needs about"),
    "unknown-option": (["check", "--clutser", "x.yaml"], "unrecognized arguments"),
    "unknown-command": (["chekc"], "invalid choice"),
}  # fmt: skip
TRAIN_OPTIONS = {
    "steps-zero": (["--steps", "0"], "argument --steps"),
    "steps-negative": (["--steps", "-3"], "argument --steps"),
    "lr-inf": (["--lr", "inf"], "argument --lr"),
    "lr-nan": (["--lr", "nan"], "argument --lr"),
    "lr-negative": (["--lr", "-1e-3"], "argument --lr"),
    "lr-overflow": (["--lr", "1e400"], "argument --lr"),
    "weight-decay-nan": (["--weight-decay", "nan"], "argument --weight-decay"),
    "weight-decay-negative": (["--weight-decay", "-1"], "argument --weight-decay"),
    "verify-tol-negative": (["--verify-tol", "-1e-5"], "argument --verify-tol"),
    "verify-tol-nan": (["--verify-tol", "nan"], "argument --verify-tol"),
    "timeout-inf": (["--timeout-s", "inf"], "argument --timeout-s"),
    "timeout-zero": (["--timeout-s", "0"], "argument --timeout-s"),
    "timeout-huge": (["--timeout-s", "1e12"], "--timeout-s: must be at most"),
    "clip-zero": (["--clip-grad", "0"], "argument --clip-grad"),
    "clip-nan": (["--clip-grad", "nan"], "argument --clip-grad"),
    "checkpoint-every-negative": (["--checkpoint-every", "-1"], "argument --checkpoint-every"),
    "seed-negative": (["--seed", "-1"], "argument --seed"),
    "seed-huge": (["--seed", str(2**70)], "--seed: must be below 2**63"),
    # --dtype is gone: the plan decides the precision.
    "dtype-flag-gone": (["--dtype", "bfloat16"], "unrecognized arguments: --dtype"),
    "resume-without-dir": (["--resume"], "--resume: needs --checkpoint-dir"),
}


@pytest.mark.parametrize("case", OPTIONS)
def test_bad_option_values(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, words = OPTIONS[case]
    good = _good(tmp_path)
    _expect_one_line([a.replace("{cluster}", good["cluster"]) for a in argv], (words,), capsys)


@pytest.mark.parametrize("case", TRAIN_OPTIONS)
def test_bad_train_option_values(case, tmp_path, capsys):
    extra, words = TRAIN_OPTIONS[case]
    _expect_one_line(["train", "--plan", _good(tmp_path)["plan"], *extra], (words,), capsys)


def _fs_cases(tmp_path) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    good = _good(tmp_path)
    a_file = _write(tmp_path, "a-file", "x")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    under_file = f"{a_file}/sub/out.json"
    nowhere = "/proc/hetpp-no-such-dir/out.json"  # not creatable, even as root
    plan = ["plan", "--cluster", good["cluster"], "--model", "tiny-gpt", "--global-batch", "4",
            "--seq-len", "32"]  # fmt: skip
    train = ["train", "--plan", good["plan"]]
    empty_bin = _write(tmp_path, "empty.bin", b"")
    odd_bin = _write(tmp_path, "odd.bin", b"\x01\x02\x03")
    short_txt = _write(tmp_path, "short.txt", "hi")
    return {
        "cluster-is-dir": (["check", "--cluster", str(a_dir)], (str(a_dir), "is a directory")),
        "cluster-missing": (["check", "--cluster", str(tmp_path / "no.yaml")], ("file not found",)),
        "cluster-unreadable": (["check", "--cluster", "/proc/self/mem"], ("cannot read",)),
        "profile-endless": (
            ["check", "--profile", "/dev/zero"],
            ("/dev/zero", "larger than the limit"),
        ),
        "plan-is-dir": (["estimate", str(a_dir)], (str(a_dir), "is a directory")),
        "profile-is-dir": (["check", "--profile", str(a_dir)], (str(a_dir), "is a directory")),
        "model-is-dir": (["check", "--model", str(a_dir)], (str(a_dir),)),
        "plan-out-dir": ([*plan, "--out", str(a_dir)], (str(a_dir), "--out: is a directory")),
        "plan-out-under-file": ([*plan, "--out", under_file], (under_file, "--out: cannot write")),
        "plan-out-nowhere": ([*plan, "--out", nowhere], (nowhere, "--out: cannot write")),
        "compare-plot-dir": (["compare", *plan[1:], "--plot", str(a_dir)], ("--plot",)),
        "simulate-gantt-dir": (["simulate", good["plan"], "--gantt", str(a_dir)], ("--gantt",)),
        "simulate-gantt-nowhere": (["simulate", good["plan"], "--gantt", nowhere], ("--gantt",)),
        "profile-out-dir": (["profile", "--model", "tiny-gpt", "--out", str(a_dir)], ("--out",)),
        "demo-out-file": (["demo", "--out", a_file], (a_file, "--out: is a file")),
        "demo-out-nowhere": (["demo", "--out", "/proc/hetpp-x/demo"], ("--out: cannot write",)),
        "train-metrics-dir": ([*train, "--metrics", str(a_dir)], ("--metrics: is a directory",)),
        "train-metrics-nowhere": ([*train, "--metrics", nowhere], ("--metrics: cannot write",)),
        "train-ckpt-file": ([*train, "--checkpoint-dir", a_file], (a_file, "is a file")),
        "train-ckpt-under-file": ([*train, "--checkpoint-dir", f"{a_file}/c"], ("cannot write",)),
        "train-ckpt-nowhere": ([*train, "--checkpoint-dir", "/proc/hetpp-c"], ("cannot write",)),
        "train-data-missing": ([*train, "--data", str(tmp_path / "no.txt")], ("file not found",)),
        "train-data-dir": ([*train, "--data", str(a_dir)], (str(a_dir), "--data")),
        "train-data-empty-bin": ([*train, "--data", empty_bin], (empty_bin, "--data")),
        "train-data-odd-bin": ([*train, "--data", odd_bin], (odd_bin, "--data")),
        "train-data-short": ([*train, "--data", short_txt], (short_txt, "--data", "tokens")),
        "train-plan-missing": (["train", "--plan", str(tmp_path / "p.json")], ("file not found",)),
    }


FS_CASES = [
    "cluster-is-dir", "cluster-missing", "cluster-unreadable", "profile-endless", "plan-is-dir",
    "profile-is-dir",
    "model-is-dir", "plan-out-dir", "plan-out-under-file", "plan-out-nowhere", "compare-plot-dir",
    "simulate-gantt-dir", "simulate-gantt-nowhere", "profile-out-dir", "demo-out-file",
    "demo-out-nowhere", "train-metrics-dir", "train-metrics-nowhere", "train-ckpt-file",
    "train-ckpt-under-file", "train-ckpt-nowhere", "train-data-missing", "train-data-dir",
    "train-data-empty-bin", "train-data-odd-bin", "train-data-short", "train-plan-missing",
]  # fmt: skip


@pytest.mark.parametrize("case", FS_CASES)
def test_file_system_errors(case, tmp_path, capsys):
    argv, words = _fs_cases(tmp_path)[case]
    _expect_one_line(argv, words, capsys)


def test_the_case_count_meets_the_issue():
    n = (
        len(STRUCTURE_CASES)
        + len(hc.CLUSTER_VALUES) + len(hc.MODEL_VALUES) + len(hc.HF_FILES)
        + len(hc.PLAN_VALUES) * 2 + len(hc.PLAN_SIZES) + len(hc.PROFILE_VALUES)
        + len(OPTIONS) + len(TRAIN_OPTIONS) + len(FS_CASES)
    )  # fmt: skip
    assert n >= 150, n


SIZE_SCRIPT = """
import resource, sys, json
resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))
from hetpp.cli.main import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps(codes))
"""


def test_size_cases_fit_in_bounded_memory(tmp_path):
    """The size cases again, in a process that may not map more than 1 GiB: each ends in exit 2
    without building what it describes (a list of 10^9 devices alone would need ~100 GB)."""
    argvs = []
    for table, command in ((hc.CLUSTER_VALUES, ["check", "--cluster"]),):
        for case in ("gpus-1e9", "count-1e9", "both-large"):
            argvs.append([*command, _write(tmp_path, f"{case}.yaml", table[case][0])])
    for case in ("alias-bomb", "deep-nesting"):
        argvs.append(
            ["check", "--cluster", _write(tmp_path, f"{case}.yaml", hc.STRUCTURE[case][0])]
        )
    argvs.append(["check", "--model", _write(tmp_path, "m.yaml", hc.MODEL_VALUES["layers-1e6"][0])])
    for case in hc.PLAN_SIZES:
        argvs.append(["simulate", _write(tmp_path, f"{case}.json", hc.PLAN_SIZES[case][0])])
    script = textwrap.dedent(SIZE_SCRIPT).replace("CAP", str(2**30))
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [2] * len(argvs), out.stderr


def test_hetpp_train_refuses_to_start_thousands_of_local_ranks(tmp_path, capsys):
    f = _write(tmp_path, "many.json", hc.many_devices_plan(300))
    _expect_one_line(["train", "--plan", f], (f, "ranks on this machine is 300"), capsys)


def test_a_model_too_big_for_this_machine_is_refused_before_any_rank(tmp_path, capsys):
    plan = hc.good_plan()
    plan["model"]["vocab_size"] = 10**12  # 6.4e13 embedding parameters: petabytes of state
    f = _write(tmp_path, "huge.json", json.dumps(plan))
    _expect_one_line(["train", "--plan", f], (f, "model: the ranks need about", "GB"), capsys)


def test_a_torchrun_rank_checks_paths_before_joining(tmp_path, capsys, monkeypatch):
    """Without `hetpp train` (torchrun), each rank runs the path checks before the rendezvous."""
    from hetpp.runtime.preflight import LAUNCHED
    from hetpp.train import main as rank_main

    monkeypatch.delenv(LAUNCHED, raising=False)
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "a-dir").mkdir()
    argv = ["--plan", _good(tmp_path)["plan"], "--metrics", str(tmp_path / "a-dir")]
    assert rank_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--metrics: is a directory" in err, err
