"""A training script that records, before anything else runs, the environment its rank was
forked with and what torch makes of its device, without touching CUDA (test_gpu_env_in_child.py).
With GPU_ENV_USE_CUDA=1 (test_gpu.py, on a GPU) it then uses its device and records what CUDA saw.

The record goes to the file named by GPU_ENV_RECORD.
"""

import os  # the first line: the environment as the forked child has it before any user code

SEEN = dict(os.environ)

import json  # noqa: E402
import sys  # noqa: E402

PRELOADED = "torch" in sys.modules

import torch  # noqa: E402

from dlu_prime.runtime import current_worker  # noqa: E402

NAMES = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "DLU_DEVICE", "DLU_DEVICES", "RANK")
record = {
    "pid": os.getpid(),
    "env": {name: SEEN.get(name) for name in NAMES},
    "torch_preloaded": PRELOADED,
    "torch_device": str(torch.device(SEEN.get("DLU_DEVICE", "cpu"))),
    "worker_device": current_worker().device,
    "worker_devices": current_worker().devices,
    # what torch will number as cuda:0, cuda:1, ... (read from the environment, no CUDA call)
    "visible_to_torch": [str(d) for d in torch.cuda._parse_visible_devices()],  # pyright: ignore[reportPrivateUsage]
    "cuda_initialized": torch.cuda.is_initialized(),
    "bad_fork": torch.cuda._is_in_bad_fork(),  # pyright: ignore[reportPrivateUsage]
}
if SEEN.get("GPU_ENV_USE_CUDA") == "1":  # on a GPU: now use CUDA, as the rank's training would
    device = torch.device(SEEN["DLU_DEVICE"])
    torch.cuda.set_device(device)
    square = torch.ones(256, 256, device=device)
    record["cuda"] = {
        "device_count": torch.cuda.device_count(),
        "uuid": str(torch.cuda.get_device_properties(device).uuid),
        "matmul_sum": float((square @ square).sum().item()),
    }
path = SEEN["GPU_ENV_RECORD"]
with open(path + ".tmp", "w", encoding="utf-8") as out:
    json.dump(record, out)
os.replace(path + ".tmp", path)
