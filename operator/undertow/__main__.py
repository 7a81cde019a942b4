import sys

from undertow.cli import main

sys.exit(main())
