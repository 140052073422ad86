"""One error type for every bad input: it names the file, the field and what was expected."""

from __future__ import annotations

from pydantic import ValidationError


class SpecError(ValueError):
    """A user-supplied file or value is malformed or inconsistent.

    The CLI prints `str(err)` and exits with code 2; no traceback reaches the user.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field if field is None else one_line(field, 120)
        self.message = one_line(message, 2000)
        where = ": ".join(x for x in (file, self.field) if x)
        super().__init__(f"{where}: {self.message}" if where else self.message)

    def in_file(self, file: str) -> SpecError:
        """The same error, attributed to `file` (kept if already set)."""
        return SpecError(self.message, file=self.file or file, field=self.field)


def one_line(text: str, limit: int) -> str:
    """`text` with control characters escaped and at most `limit` characters: a field name or
    value from a hostile file must not break the one-line message (or flood the terminal)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field_path(loc: tuple) -> str:
    """Pydantic's error location as `nodes[1].gpu`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def from_validation_error(err: ValidationError, file: str | None = None) -> SpecError:
    """Turn pydantic's error list into one SpecError naming every bad field."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append((field_path(e["loc"]) or "(top level)", msg))
    if len(lines) == 1:
        return SpecError(lines[0][1], file=file, field=lines[0][0])
    body = "; ".join(f"{f}: {m}" for f, m in lines)
    return SpecError(f"{len(lines)} problems: {body}", file=file)
