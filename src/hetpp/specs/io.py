"""Reading YAML/JSON spec files into validated models, with errors that name the file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hetpp.specs.errors import SpecError, from_validation_error

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("file not found", file=str(p))
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"cannot parse: {e}".splitlines()[0], file=str(p)) from None
    if not isinstance(data, dict):
        raise SpecError(
            f"expected a mapping at the top level, got {type(data).__name__}", file=str(p)
        )
    return data


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


def write_atomic(path: str | Path, text: str) -> None:
    """Write text so that readers see the old file or the new one, never half of one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
