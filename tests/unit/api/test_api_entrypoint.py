"""Entrypoint strings: object paths, scripts, modules and torchrun commands."""

from __future__ import annotations

import pytest

from dlu_api.spec.entrypoint import Entrypoint, EntrypointKind, parse_entrypoint

OBJECT, SCRIPT, MODULE, TORCHRUN = (
    EntrypointKind.OBJECT,
    EntrypointKind.SCRIPT,
    EntrypointKind.MODULE,
    EntrypointKind.TORCHRUN,
)


@pytest.mark.parametrize(
    ("text", "kind", "target", "args"),
    [
        ("pkg.mod:main", OBJECT, "pkg.mod:main", ()),
        ("train:main", OBJECT, "train:main", ()),
        ("pkg.mod:Trainer.run", OBJECT, "pkg.mod:Trainer.run", ()),
        ("  pkg.mod:main  ", OBJECT, "pkg.mod:main", ()),
        ("pkg.mod.main", OBJECT, "pkg.mod:main", ()),
        ("a.b", OBJECT, "a:b", ()),
        ("_private.mod_2._fn", OBJECT, "_private.mod_2:_fn", ()),
        ("train.py", SCRIPT, "train.py", ()),
        ("pkg.train.py", SCRIPT, "pkg.train.py", ()),
        ("scripts/train.py", SCRIPT, "scripts/train.py", ()),
        ("train.py --lr 1e-3 --epochs 2", SCRIPT, "train.py", ("--lr", "1e-3", "--epochs", "2")),
        ("train.py --name 'hello world'", SCRIPT, "train.py", ("--name", "hello world")),
        ("'my dir/train.py' -x", SCRIPT, "my dir/train.py", ("-x",)),
        ("python train.py --a", SCRIPT, "train.py", ("--a",)),
        ("python3 train.py", SCRIPT, "train.py", ()),
        ("-m pkg.mod", MODULE, "pkg.mod", ()),
        ("-m pkg.mod --lr 1 pos", MODULE, "pkg.mod", ("--lr", "1", "pos")),
        ("python -m pkg.mod --x", MODULE, "pkg.mod", ("--x",)),
        ("python3 -m tool", MODULE, "tool", ()),
    ],
)
def test_parse_entrypoint_forms(text: str, kind: EntrypointKind, target: str, args: tuple[str, ...]) -> None:
    assert parse_entrypoint(text) == Entrypoint(kind, target, args)


@pytest.mark.parametrize(
    "text",
    [
        "torchrun train.py",
        "torchrun --nproc-per-node=2 train.py --lr 1",
        "python -m torch.distributed.run --nnodes=2 train.py",
        "python3 -m torch.distributed.run train.py",
        "python -m torch.distributed.launch train.py",
    ],
)
def test_torchrun_commands_are_kept_whole(text: str) -> None:
    entry = parse_entrypoint(text)
    assert entry.kind is TORCHRUN
    assert entry.target == text
    assert entry.args == ()


def test_module_and_attr_of_object_entrypoint() -> None:
    entry = parse_entrypoint("pkg.sub.mod.Trainer")
    assert entry.module == "pkg.sub.mod"
    assert entry.attr == "Trainer"
    colon = parse_entrypoint("pkg.mod:Outer.inner")
    assert (colon.module, colon.attr) == ("pkg.mod", "Outer.inner")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("x y", "is not one of"),
        ("train", "is not one of"),
        ("python", "is not one of"),
        ("1abc:f", "is not one of"),
        ("pkg.mod:", "is not one of"),
        (":main", "is not one of"),
        ("pkg..mod:f", "is not one of"),
        ("pkg-mod:main", "is not one of"),
        ("-m", "'-m' must be followed by a module name"),
        ("python -m", "'-m' must be followed by a module name"),
        ("-m 1bad", "'-m' must be followed by a module name"),
        ("-m pkg/mod.py", "'-m' must be followed by a module name"),
        ("train.py 'unclosed", "cannot split"),
    ],
)
def test_parse_entrypoint_rejects(text: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_entrypoint(text)
    assert needle in str(info.value)


def test_rejection_lists_the_accepted_forms() -> None:
    with pytest.raises(ValueError) as info:
        parse_entrypoint("x y")
    message = str(info.value)
    for form in ("module:function", "module.function", "script.py", "-m package.module", "torchrun"):
        assert form in message
