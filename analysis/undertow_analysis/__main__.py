"""`python -m undertow_analysis HISTORY --out DIR`, or as a file under spark-submit:

    spark-submit analysis/undertow_analysis/__main__.py HISTORY --out DIR
"""

import os
import sys

if not __package__:
    # Run as a file (spark-submit): Python put this directory first on sys.path, where io.py
    # and html.py would shadow the standard library. Import the package from its parent.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(here)] + [p for p in sys.path if os.path.abspath(p) != here]

from undertow_analysis.job import main

if __name__ == "__main__":
    sys.exit(main())
