"""A user's job file that starts its job when imported (no `if __name__ == "__main__":`), and
whose role's entrypoint is a function of this very module: DLU imports it in the role's actor
to run `self_submitting_job:work`, where the import submits the job again."""

import sys

from dlu_api import Job
from dlu_api.spec import spec_from_dict


def work() -> None:
    print("working", flush=True)


SPEC = {
    "name": "self-submitting",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "self_submitting_job:work", "resources": {"cpu": 0.1}}],
}

status = Job(spec_from_dict(SPEC)).run()
print(f"driver: exit {status.exit_code}: {status.reason}", flush=True)
sys.exit(status.exit_code or 0)
