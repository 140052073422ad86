"""The package layering: specs <- profile <- cost <- planner, sim <- report <- demo, cli; the
runtime beside them, on specs (the Plan) and profile rows only. A package may import only the
packages listed for it (imports anywhere in a module count, lazy ones too)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "hetpp"

PLANNING = {"specs", "profile", "cost", "planner", "sim", "report"}
ALLOWED = {
    "specs": set(),
    "profile": {"specs"},
    "cost": {"specs", "profile"},
    "planner": {"specs", "profile", "cost"},
    "sim": {"specs", "profile", "cost"},
    "report": {"specs", "profile", "cost", "planner", "sim"},
    "dataset": {"specs"},  # token shards: written by `hetpp data prepare`, read by the runtime
    "runtime": {"specs", "profile", "dataset"},
    "demo": PLANNING | {"runtime", "dataset"},
    "cli": PLANNING | {"runtime", "demo", "dataset"},
    "train": {"specs", "runtime"},  # the `torchrun -m hetpp.train` entry point
}


def imports_of(path: Path) -> set[str]:
    """The hetpp packages a module imports (`hetpp.cost.step` -> "cost")."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("hetpp.")}
    return out


def test_no_package_imports_one_above_it():
    bad = []
    seen = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).parts
        package = rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
        if package == "__init__":
            continue
        seen.add(package)
        assert package in ALLOWED, f"new package {package}: give it a place in the layering"
        for dep in imports_of(path) - ALLOWED[package] - {package}:
            bad.append(f"{path.relative_to(SRC)} imports hetpp.{dep}")
    assert not bad, "\n".join(bad)
    assert seen >= PLANNING | {"runtime", "cli"}
