"""A plain script entrypoint: checks its arguments and the worker environment, then exits 0."""

import os
import sys

assert sys.argv[1:] == ["--lr", "1e-3", "two words"], sys.argv
assert os.environ["DLU_ROLE"] == "script"
assert os.environ["ROLE_WORLD_SIZE"] == "2"
print("script ran as rank", os.environ["ROLE_RANK"])
