"""The worker script the embedded Ray's raylet runs (`dlu_prime.ray_workers` says why).

Run as a file, so its own folder (the dlu_prime package) leads sys.path: drop it before any
import, or this package's modules would shadow top-level names. An interpreter without DLU
(a runtime env with its own Python) runs Ray's own worker script instead.
"""

import os
import sys

if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    try:
        from dlu_prime.ray_workers import main
    except ImportError:
        import importlib.util

        ray_spec = importlib.util.find_spec("ray")
        if ray_spec is None or ray_spec.origin is None:
            raise SystemExit(f"dlu: no Ray in {sys.executable} to run a Ray worker with") from None
        script = os.path.join(os.path.dirname(ray_spec.origin), "_private", "workers", "default_worker.py")
        os.execv(sys.executable, [sys.executable, script, *sys.argv[1:]])
    main(sys.argv[1:])
