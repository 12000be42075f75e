"""`python -m mistill.warm_server SOCKET`: the warm interpreter's process, serving `mistill`'s entry point.

`mistill.warm.run_warm` starts it; it imports the heavy modules once (`mistill.warm.serve`) and forks one child
per `mistill` command that a DVC stage starts. It lives apart from `mistill.warm` so that the server module
never imports the command line that calls it: `mistill.cli` asks `mistill.warm` to delegate, and this entry
point alone wires the two together. Importing `mistill.cli` imports neither torch nor anything that sets
the environment, so the server's record of the environment before its imports is unchanged by it.
"""

from __future__ import annotations

import sys

from mistill.cli import main
from mistill.warm import serve

if __name__ == "__main__":
    serve(sys.argv[1], run=main)
