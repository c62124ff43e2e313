"""Memory sizes: Ray wants bytes; people write "4GiB" and read "16.3 GiB"."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

# An integer this small is almost always megabytes written where bytes were meant.
SUSPICIOUS_BYTES = 1024**2


def parse_memory(value: object) -> int:
    """Bytes from an int, a float, or a string such as "4GiB", "512MB", "1.5G".

    Raises:
        ValueError: the value is negative, not a size, or has an unknown unit.
    """
    if isinstance(value, bool):
        raise ValueError("memory must be a size in bytes or a string like '4GiB', not a boolean")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"memory {value!r} is not a whole number of bytes; write e.g. '1.5GiB'")
        size = int(value)
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(f"memory {value!r} is not a size; write bytes or e.g. '4GiB', '512MB'")
        number, unit = match.groups()
        factor = _UNITS.get(unit.lower())
        if factor is None:
            raise ValueError(
                f"memory {value!r} has unknown unit {unit!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
            )
        exact = Decimal(number) * factor  # float would turn "4.1GB" into 4099999999
        if factor == 1 and exact != exact.to_integral_value():
            raise ValueError(f"memory {value!r} is not a whole number of bytes; e.g. '1.5KiB'")
        size = int(exact)
    else:
        raise ValueError(f"memory must be bytes or a string like '4GiB', got {type(value).__name__}")
    if size < 0:
        raise ValueError(f"memory {value!r} is negative")
    return size


def format_memory(size: int) -> str:
    """The shortest exact binary-unit spelling of a byte count, for messages."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


_READABLE = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))

# Ray resources whose amounts are bytes.
BYTE_RESOURCES = frozenset({"memory", "object_store_memory"})


def format_bytes(size: float) -> str:
    """A byte count for people: '16.3 GiB', '512 MiB', '1.04 GiB', '900 B' (three significant
    digits at most). Every message that prints memory uses this, never a raw float."""
    sign, size = ("-", -size) if size < 0 else ("", size)
    for unit, factor in _READABLE:
        value = size / factor
        if round(value, 2) >= 1:
            return f"{sign}{_three_digits(value)} {unit}"
    return f"{sign}{round(size):d} B"


def _three_digits(value: float) -> str:
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_amount(name: str, amount: float) -> str:
    """One Ray resource amount for a message: bytes in units for memory, else the number."""
    return format_bytes(amount) if name in BYTE_RESOURCES else f"{amount:g}"


def format_resources(resources: Mapping[str, float]) -> str:
    """A Ray resource dict for a message: "CPU 4, GPU 1, memory 16.3 GiB" (Ray's per-node
    `node:...` markers left out: they say nothing about what is missing)."""
    parts = [
        f"{name} {format_amount(name, float(amount))}"
        for name, amount in sorted(resources.items())
        if not name.startswith("node:")
    ]
    return ", ".join(parts) or "nothing"
