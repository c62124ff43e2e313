"""What an entrypoint string is: a Python object path, a script, a module or a torchrun command.

Only syntax is checked here; whether the module imports is checked where the code runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from enum import StrEnum

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_COLON_PATH = re.compile(rf"^{_DOTTED}:{_DOTTED}$")
_DOT_PATH = re.compile(rf"^{_IDENT}(?:\.{_IDENT})+$")
_MODULE = re.compile(rf"^{_DOTTED}$")

TORCHRUN_PREFIXES: tuple[tuple[str, ...], ...] = (
    ("torchrun",),
    ("python", "-m", "torch.distributed.run"),
    ("python3", "-m", "torch.distributed.run"),
    ("python", "-m", "torch.distributed.launch"),
    ("python3", "-m", "torch.distributed.launch"),
)


class EntrypointKind(StrEnum):
    OBJECT = "object"  # module:attr or module.attr: a function, or a class with @rpc methods
    SCRIPT = "script"  # path/to/script.py args...
    MODULE = "module"  # -m package.module args...
    TORCHRUN = "torchrun"  # a whole torchrun command line


@dataclass(frozen=True)
class Entrypoint:
    """A parsed entrypoint. For OBJECT, `target` is "module:attr"; otherwise the script or module."""

    kind: EntrypointKind
    target: str
    args: tuple[str, ...] = field(default=())

    @property
    def module(self) -> str:
        """The module to import for OBJECT entrypoints."""
        return self.target.split(":", 1)[0]

    @property
    def attr(self) -> str:
        """The attribute path inside the module for OBJECT entrypoints."""
        return self.target.split(":", 1)[1]


def split_command(text: str) -> list[str]:
    """Shell-split a command line.

    Raises:
        ValueError: unbalanced quotes.
    """
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot split {text!r} into arguments: {exc}") from None


def is_torchrun_command(tokens: list[str]) -> bool:
    return any(tuple(tokens[: len(p)]) == p for p in TORCHRUN_PREFIXES)


def parse_entrypoint(text: str) -> Entrypoint:
    """Classify an entrypoint string.

    Raises:
        ValueError: the text is none of the accepted forms; the message lists them.
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("entrypoint is empty")
    if _COLON_PATH.match(stripped):
        return Entrypoint(EntrypointKind.OBJECT, stripped)
    if _DOT_PATH.match(stripped) and not stripped.endswith(".py"):  # "train.py" is a script
        module, _, attr = stripped.rpartition(".")
        return Entrypoint(EntrypointKind.OBJECT, f"{module}:{attr}")
    tokens = split_command(stripped)
    if is_torchrun_command(tokens):
        return Entrypoint(EntrypointKind.TORCHRUN, stripped)
    if tokens[0] in ("python", "python3") and len(tokens) > 1:
        tokens = tokens[1:]
    if tokens[0] == "-m":
        if len(tokens) < 2 or not _MODULE.match(tokens[1]):
            raise ValueError(f"entrypoint {text!r}: '-m' must be followed by a module name")
        return Entrypoint(EntrypointKind.MODULE, tokens[1], tuple(tokens[2:]))
    if tokens[0].endswith(".py"):
        return Entrypoint(EntrypointKind.SCRIPT, tokens[0], tuple(tokens[1:]))
    raise ValueError(
        f"entrypoint {text!r} is not one of: 'package.module:function', 'package.module.function', "
        "'script.py args...', '-m package.module args...', or 'torchrun ... script.py args...'"
    )
