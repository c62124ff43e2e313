"""The worker script the embedded Ray's raylet runs (`dlu_prime.ray_workers` says why).

Run as a file, so its own folder (the dlu_prime package) leads sys.path: drop it before any
import, or this package's modules would shadow top-level names.
"""

import sys

if __name__ == "__main__":
    sys.path.pop(0)
    from dlu_prime.ray_workers import main

    main(sys.argv[1:])
