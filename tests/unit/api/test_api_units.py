"""Memory sizes: bytes as ints, or strings such as "4GiB", stored as bytes."""

from __future__ import annotations

import pytest

from dlu_api.spec.units import (
    SUSPICIOUS_BYTES,
    format_amount,
    format_bytes,
    format_memory,
    format_resources,
    parse_memory,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (1, 1),
        (4 * 2**30, 4 * 2**30),
        (2048.0, 2048),
        ("0", 0),
        ("123", 123),
        ("123B", 123),
        ("4GiB", 4 * 2**30),
        ("4Gi", 4 * 2**30),
        ("512MB", 512 * 10**6),
        ("512M", 512 * 10**6),
        ("512MiB", 512 * 2**20),
        ("1.5G", 1_500_000_000),
        ("1.5GiB", 3 * 2**29),
        ("2KB", 2000),
        ("2KiB", 2048),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("4.1GB", 4_100_000_000),  # exact, not 4099999999 from float rounding
        ("4.35MB", 4_350_000),
        (" 4GiB ", 4 * 2**30),
        ("4 GiB", 4 * 2**30),
        ("4gib", 4 * 2**30),
        ("512mb", 512 * 10**6),
        ("4GIB", 4 * 2**30),
        ("1.5KiB", 1536),
    ],
)
def test_parse_memory_accepts(value: object, expected: int) -> None:
    assert parse_memory(value) == expected
    assert isinstance(parse_memory(value), int)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("4XB", "unknown unit 'XB'"),
        ("4 parsecs", "unknown unit"),
        ("GiB", "not a size"),
        ("", "not a size"),
        ("four GiB", "not a size"),
        ("4 G iB", "not a size"),
        ("-4GiB", "not a size"),
        ("1e9", "not a size"),
        (-1, "negative"),
        (-2048.0, "negative"),
        (True, "boolean"),
        (False, "boolean"),
        (1.5, "not a whole number"),
        (0.25, "not a whole number"),
        ("1.5B", "not a whole number"),
        ("1.5", "not a whole number"),
        (None, "NoneType"),
        ([4], "list"),
    ],
)
def test_parse_memory_rejects(value: object, needle: str) -> None:
    with pytest.raises(ValueError, match="memory") as info:
        parse_memory(value)
    assert needle in str(info.value)


def test_unknown_unit_message_lists_accepted_units() -> None:
    with pytest.raises(ValueError) as info:
        parse_memory("3PB")
    for unit in ("KB", "MB", "GB", "KiB", "MiB", "GiB", "TiB"):
        assert unit in str(info.value)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (1000, "1000B"),
        (1024, "1KiB"),
        (1536, "1536B"),
        (4 * 2**30, "4GiB"),
        (3 * 2**29, "1536MiB"),
        (2**40, "1TiB"),
    ],
)
def test_format_memory(size: int, text: str) -> None:
    assert format_memory(size) == text
    assert parse_memory(text) == size


def test_suspicious_threshold_is_one_mebibyte() -> None:
    assert parse_memory("1MiB") == SUSPICIOUS_BYTES


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (900, "900 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (512 * 2**20, "512 MiB"),
        (16 * 2**30, "16 GiB"),
        (1.63174e10, "15.2 GiB"),  # Ray reports memory as a float: never printed as 1.63174e+10
        (16.3 * 2**30, "16.3 GiB"),
        (1.04 * 2**30, "1.04 GiB"),
        (999 * 2**20, "999 MiB"),
        (2**40 * 3, "3 TiB"),
        (-2048, "-2 KiB"),
    ],
)
def test_format_bytes_is_three_digits_and_a_binary_unit(size: float, text: str) -> None:
    assert format_bytes(size) == text


def test_format_resources_prints_bytes_in_units_and_drops_node_markers() -> None:
    text = format_resources(
        {"memory": 1.63174e10, "CPU": 8.0, "object_store_memory": 2**30, "node:127.0.0.1": 1.0, "GPU": 0.5}
    )
    assert text == "CPU 8, GPU 0.5, memory 15.2 GiB, object_store_memory 1 GiB"
    assert format_amount("memory", 2**31) == "2 GiB"
    assert format_amount("CPU", 2.0) == "2"
