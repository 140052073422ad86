"""Reading and writing user files: one layer that turns every bad file into a SpecError.

Reading checks, in order: the path (missing, a directory, unreadable), the size, the encoding
(UTF-8 text, not binary or UTF-16), the syntax, and the structure before it is built into Python
objects: nesting depth, duplicate keys (YAML and JSON would silently keep the later one) and the
size after alias expansion (a YAML "billion laughs" file is a few lines). Writing checks that the
target is a file in a writable place before any work is done, so a mistake in `--out` is found
before a long run, not after it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hetpp.specs.errors import SpecError, from_validation_error
from hetpp.specs.limits import MAX_FILE_BYTES, MAX_NESTING, MAX_NODES, check_size

M = TypeVar("M", bound=BaseModel)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def read_text(path: str | Path, field: str | None = None) -> str:
    """The file's text; SpecError naming the file when it cannot be read as UTF-8 text."""
    p, file = Path(path), str(path)
    if not p.exists():
        raise SpecError("file not found", file=file, field=field)
    if p.is_dir():
        raise SpecError("is a directory; expected a file", file=file, field=field)
    try:
        with p.open("rb") as f:  # bounded: a device file (/dev/zero) never ends
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise SpecError(f"cannot read ({e.strerror or e})", file=file, field=field) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"larger than the limit of {MAX_FILE_BYTES:,} bytes", file=file)
    if b"\0" in raw:
        raise SpecError("not a text file (it holds NUL bytes: binary or UTF-16?)", file=file)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text (byte {e.start}); save it as UTF-8", file=file) from None


def parse_mapping(text: str, file: str, as_json: bool) -> dict[str, Any]:
    """Parse YAML or JSON text whose top level must be a mapping, with the structure checks."""
    try:
        data = _parse_json(text, file) if as_json else _parse_yaml(text, file)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"cannot parse: {e}".splitlines()[0], file=file) from None
    except RecursionError:
        raise SpecError(f"nested deeper than {MAX_NESTING} levels", file=file) from None
    if not isinstance(data, dict):
        raise SpecError(
            f"expected a mapping at the top level, got {type(data).__name__}", file=file
        )
    return data


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file (by suffix) whose top level must be a mapping."""
    return parse_mapping(read_text(path), str(path), Path(path).suffix == ".json")


def _parse_json(text: str, file: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise SpecError("duplicate key (each key may appear once)", file=file, field=k)
            out[k] = v
        return out

    def constant(name: str) -> float:
        raise SpecError(f"{name} is not a number JSON allows; expected a finite number", file=file)

    data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    _check_depth(data, file)
    return data


def _check_depth(data: Any, file: str) -> None:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise SpecError(f"nested deeper than {MAX_NESTING} levels", file=file)
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict | list):
            stack += [(c, depth + 1) for c in children]


class _Loader(yaml.SafeLoader):
    """SafeLoader that stops composing past MAX_NESTING levels, before Python's recursion limit
    (the composer recurses once per level) is reached the slow way."""

    def __init__(self, text: str, file: str):
        super().__init__(text)
        self.file, self.depth = file, 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise SpecError(f"nested deeper than {MAX_NESTING} levels", file=self.file)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _parse_yaml(text: str, file: str) -> Any:
    loader = _Loader(text, file)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _YamlTree(file).size(node, "", 1)
        return loader.construct_document(node)
    finally:
        loader.dispose()


class _YamlTree:
    """Checks a composed YAML node graph before it is constructed: depth, duplicate keys, and
    the size it expands to (aliases share nodes, so sizes are memoised per node)."""

    def __init__(self, file: str):
        self.file = file
        self.sizes: dict[int, int] = {}
        self.open: set[int] = set()

    def size(self, node: yaml.Node, where: str, depth: int) -> int:
        key = id(node)
        if key in self.sizes:
            return self.sizes[key]
        if depth > MAX_NESTING:
            raise SpecError(f"nested deeper than {MAX_NESTING} levels", file=self.file, field=where)
        if key in self.open:
            raise SpecError("an alias refers to itself", file=self.file, field=where or None)
        self.open.add(key)
        n = 1
        if isinstance(node, yaml.MappingNode):
            n += self._mapping(node, where, depth)
        elif isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                n += self.size(child, f"{where}[{i}]", depth + 1)
        self.open.discard(key)
        self.sizes[key] = n
        check_size(
            "expanded document (values)", n, MAX_NODES, file=self.file, field=where or "size"
        )
        return n

    def _mapping(self, node: yaml.MappingNode, where: str, depth: int) -> int:
        lines: dict[tuple[str, str], str] = {}
        n = 0
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            here = f"{where}.{name}" if where else name
            if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG:
                line = f"line {k.start_mark.line + 1} column {k.start_mark.column + 1}"
                if (k.tag, k.value) in lines:
                    raise SpecError(
                        f"duplicate key (at {line}, first at {lines[k.tag, k.value]}); "
                        "each key may appear once",
                        file=self.file,
                        field=here,
                    )
                lines[k.tag, k.value] = line
            n += self.size(k, here, depth + 1) + self.size(v, here, depth + 1)
        return n


def validate_model(cls: type[M], data: Any, file: str | None = None) -> M:
    """`cls.model_validate(data)` with pydantic errors turned into a SpecError."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, file) from None
    except SpecError as e:
        raise e.in_file(file) if file else e from None


def load_model_file(cls: type[M], path: str | Path) -> M:
    """Read and validate a YAML/JSON file as `cls`."""
    return validate_model(cls, read_mapping(path), str(path))


def check_output_file(path: str | Path, field: str) -> None:
    """Refuse an output path that is a directory or lies where nothing can be written."""
    p = Path(path)
    if p.is_dir():
        raise SpecError("is a directory; expected a file to write", file=str(p), field=field)
    _probe_dir(p.parent, str(p), field)


def check_output_dir(path: str | Path, field: str) -> None:
    """Refuse an output directory that is a file or cannot be created or written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpecError("is a file; expected a directory", file=str(p), field=field)
    _probe_dir(p, str(p), field)


def _probe_dir(d: Path, file: str, field: str) -> None:
    # Writing a probe file is the only check that agrees with the OS (root, ACLs, read-only
    # mounts); os.access does not.
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=d, prefix=".hetpp-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"cannot write here ({e.strerror or e})", file=file, field=field) from None


def write_atomic(path: str | Path, text: str) -> None:
    """Write text so that readers see the old file or the new one, never half of one."""
    p = Path(path)
    if p.is_dir():
        raise SpecError("is a directory; expected a file to write", file=str(p))
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    except OSError as e:
        raise SpecError(f"cannot write ({e.strerror or e})", file=str(p)) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
