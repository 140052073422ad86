"""Everything `hetpp train` can check before it starts a rank: every option and path, the
checkpoint to resume from, and whether the model fits this machine's memory. A mistake found here
costs nothing; found by the ranks it gives one message per rank, and found after training (an
unwritable checkpoint directory) it loses the run."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hetpp.runtime.checkpoint_meta import check_files, check_resumable, latest
from hetpp.runtime.contract import check_executable
from hetpp.runtime.options import TrainOptions
from hetpp.specs.errors import SpecError
from hetpp.specs.io import check_output_dir, check_output_file
from hetpp.specs.limits import MAX_LOCAL_RANKS, check_size
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import Plan
from hetpp.specs.presets import check_folder_model

STATE_COPIES = {"adamw": 4, "sgd": 3}
"""Tensors per parameter a rank holds: weights, gradients and the optimizer's moments."""


LAUNCHED = "HETPP_PREFLIGHT_DONE"
"""Set by `hetpp train` for its ranks: the launcher has run `check_run` already."""


def check_run(opts: TrainOptions, plan: Plan, *, local: bool = True) -> list[str]:
    """SpecError naming the option or file that would make the run fail; else the notices to
    print (nothing wrong, but worth saying before the ranks start). `local`: every rank of the
    plan runs on this machine (`hetpp train`); under torchrun each rank checks with local=False,
    which leaves out the rank count and memory checks that need the whole job on one machine."""
    if local:
        check_size("ranks on this machine", plan.num_devices, MAX_LOCAL_RANKS, file=opts.plan,
                   field="pipelines")  # fmt: skip
    try:
        check_executable(plan, opts.fp64)  # a plan field the runtime cannot honour
    except SpecError as e:
        raise e.in_file(opts.plan) from None
    if opts.emulate and plan.cluster is None:
        raise SpecError("--emulate needs the plan's cluster (the `cluster` key)", file=opts.plan)
    if opts.metrics is not None:
        check_output_file(opts.metrics, "--metrics")
    if opts.data is not None:
        _check_data(opts, plan)
    if opts.init_from is not None:
        check_folder_model(plan.model, opts.init_from)
    if opts.tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise SpecError(
            "needs the tensorboard package: pip install 'hetpp[tensorboard]'", field="--tensorboard"
        )
    notices = _check_checkpoints(opts, plan, local) if opts.checkpoint_dir else []
    if local:
        _check_host_memory(opts, plan)
    return notices


def _check_data(opts: TrainOptions, plan: Plan) -> None:
    from hetpp.runtime.data import make_source  # torch: only when there is a data file

    try:
        make_source(opts.data, plan, opts.seed)
    except OSError as e:
        raise SpecError(
            f"cannot read ({e.strerror or e})", file=opts.data, field="--data"
        ) from None
    except ValueError as e:  # numpy refuses an empty or misaligned file
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"not a token file ({e})", file=opts.data, field="--data") from None


def _check_checkpoints(opts: TrainOptions, plan: Plan, local: bool) -> list[str]:
    assert opts.checkpoint_dir is not None
    check_output_dir(opts.checkpoint_dir, "--checkpoint-dir")
    if not opts.resume:
        return []
    path = latest(opts.checkpoint_dir)
    if path is None:
        # A notice, not an error: the same command can then start a job and restart it.
        return [f"--resume: no complete checkpoint in {opts.checkpoint_dir}; starting at step 0"]
    model = plan.model.model_dump(mode="json")
    meta = check_resumable(path, model, opts.optimizer, opts.seed)
    if local:  # the launcher reads every file once; under torchrun each rank checks its own
        check_files(path)
    if meta.step >= opts.steps:
        return [f"--resume: {path} is at step {meta.step}, --steps is {opts.steps}: nothing to do"]
    return []


def host_memory_bytes() -> int | None:
    """This machine's physical memory, if the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _check_host_memory(opts: TrainOptions, plan: Plan) -> None:
    """Refuse a model whose weights, gradients and optimizer state cannot fit in this machine's
    memory (all local ranks together), instead of letting the ranks allocate until killed."""
    total = host_memory_bytes()
    if total is None:
        return
    spec = ModelSpec(config=plan.model, seq_len=plan.seq_len)
    params = sum(
        spec.layers[i].stored_params
        for pipe in plan.pipelines
        for stage in pipe.stages
        for i in range(*stage.layers)
    )
    need = params * (8 if opts.fp64 else 4) * STATE_COPIES[opts.optimizer]  # fp32 masters
    if need > total:
        raise SpecError(
            f"the ranks need about {need / 1e9:,.1f} GB for weights, gradients and optimizer "
            f"state, more than this machine's {total / 1e9:,.1f} GB",
            file=str(Path(opts.plan)),
            field="model",
        )
