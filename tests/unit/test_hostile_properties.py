"""Property tests (issue 9): any mutation of a valid cluster, model or plan file, structural or
byte-level, either loads or ends in one line that names the file, with exit 2, no traceback."""

from __future__ import annotations

import json

import pytest
import yaml
from hostile_cases import GOOD_CLUSTER, GOOD_MODEL, good_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpp.cli.main import main

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from([0, 1, -1, 2**63, 10**9, 1e308, "1e9", "", "A100-80GB", "1f1b"]),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(data, prefix=()):
    """Every (path, value) in a nested dict/list document."""
    yield prefix, data
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for k, v in items:
        yield from _paths(v, (*prefix, k))


@st.composite
def mutated(draw, doc):
    """`doc` with one value replaced, one key deleted or one key added, at any depth."""
    data = json.loads(json.dumps(doc))
    paths = [p for p, _ in _paths(data) if p]
    path = draw(st.sampled_from(paths))
    *parent_path, last = path
    parent = data
    for k in parent_path:
        parent = parent[k]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[last] = draw(VALUES)
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(VALUES)
    else:
        parent.append(draw(VALUES))
    return data


@st.composite
def byte_mutated(draw, text: str) -> bytes:
    """`text` with a few bytes replaced, inserted or deleted."""
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        b = draw(st.sampled_from([*b":[]{}-&*!#'\"\n\t ,.0129e", 0, 0xFF, 0xC3]))
        if op == "set":
            data[i] = b
        elif op == "insert":
            data.insert(i, b)
        else:
            del data[i]
    return bytes(data)


def _loads_or_one_line(argv: list[str], path: str, capsys) -> None:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc in (0, 2), err
    if rc == 2:
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert path in err, err


def _dump_yaml(data) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


CLUSTER = yaml.safe_load(GOOD_CLUSTER)
MODEL = yaml.safe_load(GOOD_MODEL)
PLAN = good_plan()


DOCS = {"cluster": (CLUSTER, "c.yaml"), "model": (MODEL, "m.yaml"), "plan": (PLAN, "p.json")}


@pytest.mark.parametrize("kind", DOCS)
@SETTINGS
@given(data=st.data())
def test_mutated_file(kind, data, tmp_path, capsys):
    doc, name = DOCS[kind]
    mutant = data.draw(mutated(doc))
    f = tmp_path / name
    f.write_text(json.dumps(mutant) if name.endswith(".json") else _dump_yaml(mutant))
    _loads_or_one_line(["check", f"--{kind}", str(f)], str(f), capsys)


@SETTINGS
@given(data=st.one_of(byte_mutated(GOOD_CLUSTER), byte_mutated(GOOD_MODEL)), kind=st.booleans())
def test_byte_mutated_yaml(data, kind, tmp_path, capsys):
    f = tmp_path / "x.yaml"
    f.write_bytes(data)
    _loads_or_one_line(["check", "--cluster" if kind else "--model", str(f)], str(f), capsys)


@SETTINGS
@given(data=byte_mutated(json.dumps(PLAN, indent=1)))
def test_byte_mutated_plan(data, tmp_path, capsys):
    f = tmp_path / "p.json"
    f.write_bytes(data)
    _loads_or_one_line(["check", "--plan", str(f)], str(f), capsys)
