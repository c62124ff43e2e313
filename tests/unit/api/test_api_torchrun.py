"""torchrun command lines: parse_torchrun and from_torchrun_cmd."""

from __future__ import annotations

import re
import shlex

import pytest

from dlu_api.builder import from_torchrun_cmd
from dlu_api.errors import SpecError
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.models import DeviceType, RoleKind
from dlu_api.spec.torchrun import TorchrunCommand, default_job_name, parse_nnodes, parse_torchrun


@pytest.mark.parametrize(
    "flags",
    [
        "--nproc-per-node=4 --nnodes=2",
        "--nproc_per_node=4 --nnodes=2",
        "--nproc-per-node 4 --nnodes 2",
        "--nproc_per_node 4 --nnodes 2",
        "--nnodes=2 --nproc-per-node 4",
    ],
)
def test_both_spellings_with_and_without_equals(flags: str) -> None:
    cmd = parse_torchrun(f"torchrun {flags} train.py")
    assert (cmd.min_nodes, cmd.max_nodes, cmd.nproc_per_node) == (2, 2, 4)
    assert cmd.entrypoint == "train.py"
    assert cmd.nnodes == "2"


@pytest.mark.parametrize("flag", ["--max-restarts=3", "--max_restarts=3", "--max-restarts 3"])
def test_max_restarts_spellings(flag: str) -> None:
    assert parse_torchrun(f"torchrun {flag} train.py").max_restarts == 3


def test_defaults_without_flags() -> None:
    assert parse_torchrun("torchrun train.py") == TorchrunCommand(1, 1, 1, "train.py", None, ())


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", (1, 1)), ("3", (3, 3)), ("1:4", (1, 4)), ("2:2", (2, 2))],
)
def test_parse_nnodes(value: str, expected: tuple[int, int]) -> None:
    assert parse_nnodes(value) == expected


@pytest.mark.parametrize("value", ["0", "4:1", "0:2", "a", "1:2:3", "", "1:"])
def test_parse_nnodes_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="--nnodes"):
        parse_nnodes(value)


def test_nnodes_range() -> None:
    cmd = parse_torchrun("torchrun --nnodes=1:4 --nproc-per-node=2 train.py")
    assert (cmd.min_nodes, cmd.max_nodes) == (1, 4)
    assert cmd.nnodes == "1:4"


def test_standalone_is_one_node_and_ignored() -> None:
    cmd = parse_torchrun("torchrun --standalone --nnodes=3 --nproc-per-node=2 train.py")
    assert (cmd.min_nodes, cmd.max_nodes) == (1, 1)
    assert cmd.ignored_flags == ("standalone",)


@pytest.mark.parametrize("module_flag", ["-m", "--module"])
def test_module_forms(module_flag: str) -> None:
    cmd = parse_torchrun(f"torchrun --nproc-per-node=2 {module_flag} pkg.train --lr 0.1")
    assert cmd.entrypoint == "-m pkg.train --lr 0.1"
    entry = parse_entrypoint(cmd.entrypoint)
    assert entry.kind is EntrypointKind.MODULE
    assert (entry.target, entry.args) == ("pkg.train", ("--lr", "0.1"))


@pytest.mark.parametrize(
    "args",
    [
        ["--lr", "1e-3"],
        ["--name", "hello world"],
        ["--quote", 'it\'s "quoted"'],
        ["--empty", ""],
        ["--nnodes=5", "--standalone", "-m"],  # after the script these belong to the script
        ["$HOME", "a;b", "*.txt"],
    ],
)
def test_script_args_survive_verbatim(args: list[str]) -> None:
    line = shlex.join(["torchrun", "--nproc-per-node=2", "train.py", *args])
    cmd = parse_torchrun(line)
    assert shlex.split(cmd.entrypoint) == ["train.py", *args]
    entry = parse_entrypoint(cmd.entrypoint)
    assert entry.kind is EntrypointKind.SCRIPT
    assert entry.args == tuple(args)
    assert cmd.nproc_per_node == 2


def test_list_form_and_script_path_with_space() -> None:
    cmd = parse_torchrun(["torchrun", "--nnodes", "2", "my dir/train.py", "a b"])
    assert shlex.split(cmd.entrypoint) == ["my dir/train.py", "a b"]
    assert parse_entrypoint(cmd.entrypoint).target == "my dir/train.py"


def test_double_dash_ends_flags() -> None:
    cmd = parse_torchrun(["torchrun", "--nnodes=2", "--", "train.py", "--nnodes=5"])
    assert cmd.max_nodes == 2
    assert shlex.split(cmd.entrypoint) == ["train.py", "--nnodes=5"]


@pytest.mark.parametrize(
    "prefix",
    [
        "python -m torch.distributed.run",
        "python3 -m torch.distributed.run",
        "python -m torch.distributed.launch",
    ],
)
def test_python_module_prefix(prefix: str) -> None:
    cmd = parse_torchrun(f"{prefix} --nnodes=2 --nproc_per_node=3 train.py --x 1")
    assert (cmd.max_nodes, cmd.nproc_per_node, cmd.entrypoint) == (2, 3, "train.py --x 1")


def test_rendezvous_and_master_flags_are_ignored() -> None:
    cmd = parse_torchrun(
        "torchrun --rdzv-backend=c10d --rdzv_endpoint host:29400 --rdzv-id job1 "
        "--master-addr=10.0.0.1 --master_port 29500 --node-rank=0 --nnodes=2 "
        "--nproc-per-node=2 --monitor-interval=5 --log-dir /tmp/l train.py"
    )
    assert (cmd.max_nodes, cmd.nproc_per_node, cmd.entrypoint) == (2, 2, "train.py")
    assert cmd.log_dir == "/tmp/l"
    assert cmd.ignored_flags == (
        "master-addr",
        "master-port",
        "monitor-interval",
        "node-rank",
        "rdzv-backend",
        "rdzv-endpoint",
        "rdzv-id",
    )


@pytest.mark.parametrize("flag", ["--foo=1", "--bogus", "-x", "--nproc"])
def test_unknown_flag_is_named(flag: str) -> None:
    with pytest.raises(ValueError, match="unknown torchrun flag") as info:
        parse_torchrun(f"torchrun {flag} train.py")
    assert repr(flag) in str(info.value)


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        ("torchrun", "no training script"),
        ("torchrun --nproc-per-node=2", "no training script"),
        ("torchrun --nnodes=2 --", "no training script"),
        ("torchrun --nnodes", "--nnodes needs a value"),
        ("python train.py", "not a torchrun command"),
        ("train.py", "not a torchrun command"),
        ("torchrun --nproc-per-node=0 train.py", ">= 1"),
        ("torchrun --nproc-per-node=two train.py", "'two' is not a number"),
        ("torchrun --nnodes=4:1 train.py", "--nnodes '4:1'"),
        ("torchrun --max-restarts=many train.py", "--max-restarts 'many'"),
        ("torchrun --no-python ./a.out", "--no-python"),
        ("torchrun train.py 'unclosed", "cannot split"),
    ],
)
def test_parse_torchrun_rejects(command: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_torchrun(command)
    assert needle in str(info.value)


@pytest.mark.parametrize("word", ["gpu", "cpu", "auto"])
def test_symbolic_nproc_is_kept(word: str) -> None:
    assert parse_torchrun(f"torchrun --nproc-per-node={word} t.py").nproc_per_node == word


# from_torchrun_cmd ------------------------------------------------------------------------


def test_from_torchrun_cmd_builds_one_elastic_role() -> None:
    spec = from_torchrun_cmd("torchrun --nnodes=2 --nproc-per-node=4 --max-restarts=5 train.py --lr 1e-3")
    assert re.fullmatch(r"train-[0-9a-f]{6}", spec.name), spec.name
    assert spec.device_type is DeviceType.GPU
    assert (spec.node_num, spec.device_per_node) == (2, 4)
    [role] = spec.roles
    assert role.name == "trainer"
    assert role.kind is RoleKind.ELASTIC
    assert role.entrypoint == "train.py --lr 1e-3"
    assert role.elastic is not None
    assert (role.elastic.nnodes, role.elastic.nproc_per_node) == ("2", 4)
    assert (role.total, role.per_group) == (8, 4)
    assert role.resources.gpu == 1.0
    assert role.max_restart == 5
    assert role.is_driver


def test_from_torchrun_cmd_without_max_restarts_keeps_default() -> None:
    assert from_torchrun_cmd("torchrun train.py").roles[0].max_restart == 10


def test_from_torchrun_cmd_range_and_names() -> None:
    spec = from_torchrun_cmd(
        "torchrun --nnodes=1:4 --nproc_per_node 2 -m pkg.train",
        name="my-job",
        role="learner",
    )
    role = spec.role("learner")
    assert spec.name == "my-job"
    assert spec.node_num == 4
    assert role.elastic is not None and role.elastic.nnodes == "1:4"
    assert (role.elastic.min_nodes, role.elastic.max_nodes) == (1, 4)
    assert role.total == 8
    assert role.entrypoint == "-m pkg.train"


def test_from_torchrun_cmd_bare_script_stays_a_script() -> None:
    role = from_torchrun_cmd("torchrun --nproc-per-node=2 train.py").roles[0]
    assert parse_entrypoint(role.entrypoint).kind is EntrypointKind.SCRIPT


def test_from_torchrun_cmd_accepts_python_prefix_and_list() -> None:
    a = from_torchrun_cmd("python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 t.py", name="t")
    b = from_torchrun_cmd(["torchrun", "--nnodes=2", "--nproc_per_node=2", "t.py"], name="t")
    assert a == b


@pytest.mark.parametrize("word", ["gpu", "auto"])
def test_from_torchrun_cmd_gpu_nproc_uses_device_per_node(word: str) -> None:
    spec = from_torchrun_cmd(f"torchrun --nproc-per-node={word} train.py", device_per_node=4)
    role = spec.roles[0]
    assert spec.device_per_node == 4
    assert role.elastic is not None and role.elastic.nproc_per_node == 4
    assert role.total == 4


def test_from_torchrun_cmd_gpu_nproc_defaults_to_eight() -> None:
    spec = from_torchrun_cmd("torchrun --nproc-per-node=gpu train.py")
    assert spec.device_per_node == 8
    assert spec.roles[0].total == 8


@pytest.mark.parametrize(
    ("word", "device_type"), [("gpu", "CPU"), ("auto", "CPU"), ("cpu", "CPU"), ("cpu", "GPU")]
)
def test_from_torchrun_cmd_unresolvable_nproc_is_rejected(word: str, device_type: str) -> None:
    with pytest.raises(ValueError, match=f"--nproc-per-node={word}"):
        from_torchrun_cmd(f"torchrun --nproc-per-node={word} train.py", device_type=device_type)


@pytest.mark.parametrize("device_type", ["cpu", "CPU"])
def test_from_torchrun_cmd_cpu_when_asked(device_type: str) -> None:
    spec = from_torchrun_cmd("torchrun --nproc-per-node=3 train.py", device_type=device_type)
    assert spec.device_type is DeviceType.CPU
    assert spec.device_per_node == 0
    assert spec.roles[0].resources.gpu == 0
    assert spec.roles[0].total == 3


def test_from_torchrun_cmd_device_type_is_never_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU visible on this machine must not turn the job into a CPU job.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    spec = from_torchrun_cmd("torchrun --nproc-per-node=2 train.py", name="t")
    assert spec.device_type is DeviceType.GPU
    assert spec.roles[0].resources.gpu == 1.0
    explicit = from_torchrun_cmd("torchrun --nproc-per-node=2 train.py", device_type="gpu", name="t")
    assert explicit == spec


def test_from_torchrun_cmd_rejects_non_torchrun() -> None:
    with pytest.raises(ValueError, match="not a torchrun command"):
        from_torchrun_cmd("python train.py")


def test_from_torchrun_cmd_rule_violation_is_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        from_torchrun_cmd("torchrun --nnodes=2 --nproc-per-node=4 t.py", device_per_node=2)
    fields = {p.field for p in info.value.problems}
    assert "roles[trainer].per_group" in fields


def test_from_torchrun_cmd_says_which_flags_it_ignores(caplog: pytest.LogCaptureFixture) -> None:
    from dlu_api.builder import from_torchrun_cmd

    with caplog.at_level("WARNING", logger="dlu_api.builder"):
        from_torchrun_cmd(
            "torchrun --rdzv-backend=c10d --nnodes=1 --nproc-per-node=2 train.py", device_type="CPU"
        )
    assert "ignored: --rdzv-backend" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="dlu_api.builder"):
        from_torchrun_cmd(
            "torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=0 train.py", device_type="CPU", name="j"
        )
    assert caplog.text == ""


def test_log_flags_are_kept_not_ignored() -> None:
    cmd = parse_torchrun("torchrun --nproc-per-node=2 --log-dir=/tmp/l --redirects 3 --tee=0:1,1:2 train.py")
    assert (cmd.log_dir, cmd.redirects, cmd.tee, cmd.ignored_flags) == ("/tmp/l", "3", "0:1,1:2", ())


def test_short_log_flags() -> None:
    cmd = parse_torchrun("torchrun -r 2 -t=1 train.py")
    assert (cmd.redirects, cmd.tee) == ("2", "1")


@pytest.mark.parametrize("flag", ["--redirects=4", "--tee x", "-r 0:1,0:2", "--tee=1:"])
def test_bad_stream_mode_is_named(flag: str) -> None:
    name = "--redirects" if "-r" in flag else "--tee"
    with pytest.raises(ValueError, match=f"{name} .* is not a stream mode|{name} .* names rank 0 twice"):
        parse_torchrun(f"torchrun {flag} train.py")


def test_log_flags_reach_the_spec() -> None:
    from dlu_api.builder import from_torchrun_cmd

    spec = from_torchrun_cmd(
        "torchrun --nproc-per-node=2 --log-dir logs --redirects 1 --tee 0:3 train.py", device_type="CPU"
    )
    assert spec.logs.dir is not None and spec.logs.dir.startswith("/") and spec.logs.dir.endswith("/logs")
    # every stream to the files; on the terminal what torchrun's console would show: rank 0 both
    # (stderr not redirected, stdout tee'd), rank 1 stderr only (stdout redirected)
    assert (spec.logs.redirects, spec.logs.tee) == ("3", "0:3,1:2")
    plain = from_torchrun_cmd("torchrun --nproc-per-node=2 train.py", device_type="CPU")
    assert (plain.logs.dir, plain.logs.redirects, plain.logs.tee) == (None, "3", "3")  # torchrun prints all
    quiet = from_torchrun_cmd("torchrun --nproc-per-node=2 --redirects 3 train.py", device_type="CPU")
    assert (quiet.logs.redirects, quiet.logs.tee) == ("3", "0")


@pytest.mark.parametrize(
    ("redirects", "tee", "world", "want"),
    [
        (None, None, 4, "3"),
        ("3", None, 4, "0"),
        ("1", None, 4, "2"),
        ("3", "1", 4, "1"),
        ("2", "2", 4, "3"),
        ("0:3", None, 3, "0:0,1:3,2:3"),
        ("3", "1:2", 2, "0:0,1:2"),
    ],
)
def test_torchrun_console_becomes_tee(redirects: str | None, tee: str | None, world: int, want: str) -> None:
    from dlu_api.rank_logs import torchrun_tee

    assert torchrun_tee(redirects, tee, world) == want


# differences from torchrun: names, the restart default, --start-method, --local-ranks-filter ----


def test_two_torchrun_jobs_get_distinct_names_after_their_script() -> None:
    first = from_torchrun_cmd("torchrun --nproc-per-node=2 examples/My_Train.py", device_type="CPU")
    second = from_torchrun_cmd("torchrun --nproc-per-node=2 examples/My_Train.py", device_type="CPU")
    assert first.name != second.name
    assert first.name.startswith("my-train-") and second.name.startswith("my-train-")
    assert from_torchrun_cmd("torchrun t.py", name="mine").name == "mine"
    module = parse_torchrun("torchrun -m pkg.trainer_main --x 1")
    assert default_job_name(module, "abc") == "trainer-main-abc"
    assert default_job_name(parse_torchrun("torchrun ___.py"), "abc") == "torchrun-abc"


def test_the_restart_default_is_said_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="dlu_api.builder"):
        spec = from_torchrun_cmd("torchrun --nproc-per-node=2 train.py", device_type="CPU", name="j")
    assert spec.roles[0].max_restart == 10
    assert "DLU restarts failed ranks up to 10 times (torchrun's default is 0)" in caplog.text
    assert from_torchrun_cmd("torchrun --max-restarts=0 train.py", name="j").roles[0].max_restart == 0


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_start_method_is_checked_then_ignored(method: str) -> None:
    cmd = parse_torchrun(f"torchrun --start-method={method} train.py")
    assert cmd.ignored_flags == ("start-method",)


def test_a_bad_start_method_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"--start-method 'thread' is not one of spawn, fork, forkserver"):
        parse_torchrun("torchrun --start-method thread train.py")


def test_local_ranks_filter_limits_the_console_to_those_local_ranks() -> None:
    spec = from_torchrun_cmd(
        "torchrun --nnodes=2 --nproc-per-node=3 --local-ranks-filter=0,2 train.py",
        device_type="CPU",
        name="j",
    )
    # node-major ranks: local rank = rank % 3; the rank files keep every stream
    assert spec.logs.tee == "0:3,1:0,2:3,3:3,4:0,5:3"
    assert spec.logs.redirects == "3"
    cmd = parse_torchrun("torchrun --nproc-per-node=2 --local_ranks_filter 1 --tee 3 train.py")
    assert (cmd.local_ranks_filter, cmd.ignored_flags) == ((1,), ())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a", "not a comma-separated list of local ranks"),
        ("-1", "must list local ranks >= 0"),
        ("0,4", "names local rank 4, but --nproc-per-node is 2"),
    ],
)
def test_a_bad_local_ranks_filter_is_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_torchrun(f"torchrun --nproc-per-node=2 --local-ranks-filter={value} train.py")
