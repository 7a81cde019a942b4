"""The `minibroker` process's entry point keeps kio from importing Hypothesis (a test
dependency the broker image lacks, about a third of a broker process's imports)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from minibroker.__main__ import main
sys.argv = ["minibroker", "--help"]
try:
    main()
except SystemExit:
    pass
import kio.static._phantom
print("kio", "kio" in sys.modules, "hypothesis", kio.static._phantom.hypothesis is not None)
"""


def test_a_minibroker_process_imports_kio_without_hypothesis() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.splitlines()[-1] == "kio True hypothesis False"
