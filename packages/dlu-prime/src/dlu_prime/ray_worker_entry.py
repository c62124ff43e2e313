"""The worker script the embedded Ray's raylet runs (`dlu_prime.ray_workers` says why).

Run as a file, so its own folder (the dlu_prime package) leads sys.path: drop it before any
import, or this package's modules would shadow top-level names. An interpreter without DLU
(a runtime env with its own Python) runs Ray's own worker script instead, whose path the head
put in the environment (dlu_prime.ray_private.lean_head: the one place that knows Ray's layout).
"""

import os
import sys

if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    try:
        from dlu_prime.ray_workers import main
    except ImportError:
        script = os.environ.get("DLU_RAY_DEFAULT_WORKER")  # dlu_prime.ray_private.DEFAULT_WORKER_ENV
        if not script:
            raise SystemExit(f"dlu: no Ray worker script known to {sys.executable}") from None
        os.execv(sys.executable, [sys.executable, script, *sys.argv[1:]])
    main(sys.argv[1:])
