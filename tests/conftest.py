import os
import sys

# The tests import their helpers (launch, cases) as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))
