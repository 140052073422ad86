"""The planning side must not load torch: it runs where torch is absent and must start fast."""

import subprocess
import sys

PURE = [
    "hetpp.specs",
    "hetpp.profile.table",
    "hetpp.profile.estimator",
    "hetpp.cost",
    "hetpp.cost.step",
    "hetpp.planner",
    "hetpp.sim",
    "hetpp.report.tables",
    "hetpp.report.plans",
    "hetpp.report.inputs",
    "hetpp.dataset",  # `hetpp data prepare` and the shard format: numpy and tokenizers only
    "hetpp.demo",  # torch only inside demo.emulated.profile_cpu, and in the training runs
    # The launcher's side of the runtime: `hetpp train` checks and starts ranks without torch.
    "hetpp.runtime.options",
    "hetpp.runtime.env",
    "hetpp.runtime.launch",
    "hetpp.runtime.contract",
    "hetpp.runtime.metrics",
]


def test_pure_packages_do_not_import_torch():
    code = (
        "import importlib, pkgutil, sys\n"
        f"for name in {PURE!r}:\n"
        "    mod = importlib.import_module(name)\n"
        "    for m in pkgutil.walk_packages(getattr(mod, '__path__', []), name + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
