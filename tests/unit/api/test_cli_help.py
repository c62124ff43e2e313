"""Every `dlu` command's --help shows its help text whole: no bracketed word (`[role/rankN]`,
`[flags]`) is eaten as markup."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from dlu_api.cli import app

BRACKETED = re.compile(r"\[[^\]\s]*(?: [^\]\s]+)*\]")


def _commands() -> dict[str, Any]:
    group: Any = typer.main.get_command(app)  # typer's own click: a group with `commands`
    return dict(group.commands)


def _source_texts(command: Any) -> list[str]:
    texts = [command.help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return texts


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_help_texts_have_bracketed_words_to_check() -> None:
    found = {
        word
        for command in _commands().values()
        for t in _source_texts(command)
        for word in BRACKETED.findall(t)
    }
    assert {"[role/rankN]", "[role/rankN:err]", "[flags]"} <= found


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_keeps_every_bracketed_word(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    shown = _flat(result.output)
    for text in _source_texts(_commands()[name]):
        for word in BRACKETED.findall(text):
            assert _flat(word) in shown, f"`dlu {name} --help` lost {word!r}:\n{result.output}"


def test_help_of_dlu_keeps_its_own_text() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "DLU: run and watch" in result.output
