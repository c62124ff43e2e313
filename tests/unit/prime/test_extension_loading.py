"""Extensions are found by entry-point name (group `dlu.extensions`) or 'module:Class'."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_prime import extension as ext
from dlu_prime.extension import Extension, ExtensionError, NodeInfo, load_extension


class GoodExtension(Extension):
    def relaunch_nodes_impl(self, nodes: list[NodeInfo]) -> list[NodeInfo]:
        return nodes


class NotAnExtension:
    pass


def spec(extension: str | None) -> Any:
    return spec_from_dict(
        {
            "name": "j",
            "device_type": "CPU",
            "device_per_node": 0,
            "extension": extension,
            "roles": [{"name": "w", "entrypoint": "m:f"}],
        }
    )


def test_no_extension_named_gives_none() -> None:
    assert load_extension(spec(None)) is None


def test_module_colon_class_is_loaded() -> None:
    loaded = load_extension(spec(f"{__name__}:GoodExtension"))
    assert isinstance(loaded, GoodExtension) and loaded.spec.name == "j"


def test_entry_point_name_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    point = EntryPoint(name="test-cluster", value=f"{__name__}:GoodExtension", group=ext.ENTRY_POINT_GROUP)
    monkeypatch.setattr(ext, "entry_points", lambda group: [point] if group == ext.ENTRY_POINT_GROUP else [])
    assert isinstance(load_extension(spec("test-cluster")), GoodExtension)


def test_unknown_name_says_what_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    point = EntryPoint(name="kuberay", value=f"{__name__}:GoodExtension", group=ext.ENTRY_POINT_GROUP)
    monkeypatch.setattr(ext, "entry_points", lambda group: [point])
    with pytest.raises(ExtensionError, match=r"'nope' is not registered .* \(registered: kuberay\)"):
        load_extension(spec("nope"))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_module_xyz:Thing", "cannot be loaded"),
        (f"{__name__}:Missing", "cannot be loaded"),
        (f"{__name__}:NotAnExtension", "is not a subclass of dlu_prime.extension.Extension"),
    ],
)
def test_bad_extensions_are_refused_with_the_reason(name: str, message: str) -> None:
    with pytest.raises(ExtensionError, match=message):
        load_extension(spec(name))
