"""The `minibroker` process's entry point (the console script and ``python -m minibroker``).

kio registers Hypothesis strategies for its types whenever Hypothesis is importable. The broker
image has no Hypothesis, but a development install has it (a test dependency), and importing
it cost each broker, controller and topics process about 0.2 s of CPU before it served (of
about 0.6 s of imports; a `make test` starts about 300 of them). A process that runs the
command line never generates test data, so kio is kept from importing it here, before
anything imports kio; in-process users of `minibroker.cli` (none today) keep Hypothesis.
"""

import sys


def main() -> int:
    sys.modules.setdefault("hypothesis", None)  # None in sys.modules: the import fails
    from minibroker.cli import main as command_line

    return command_line()


if __name__ == "__main__":
    sys.exit(main())
