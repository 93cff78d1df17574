"""Prints, as JSON, the host and the given variables as this rank sees them.
Usage: environment.py NAME..."""

import json
import os
import socket
import sys

print(json.dumps({"host": socket.gethostname(), **{name: os.environ.get(name) for name in sys.argv[1:]}}))
