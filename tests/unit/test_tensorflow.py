"""ringreduce's core leaves TensorFlow unimported until its binding is."""

import subprocess
import sys


def test_importing_ringreduce_does_not_import_tensorflow():
    code = "import sys, ringreduce; ringreduce.allreduce; print('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "False"

