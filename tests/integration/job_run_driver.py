"""`Job(spec).run()` from a user's Python program: a local job that runs until interrupted."""

import sys

from dlu_api import Job
from dlu_api.spec import spec_from_dict

SPEC = {
    "name": sys.argv[1],
    "device_type": "CPU",
    "device_per_node": 0,
    "health": {"monitor_interval_s": 0.2},
    "roles": [{"name": "worker", "entrypoint": "workloads:forever", "total": 2, "resources": {"cpu": 0.1}}],
}

try:
    Job(spec_from_dict(SPEC)).run()
except KeyboardInterrupt:
    print("driver: interrupted", flush=True)
    sys.exit(130)
