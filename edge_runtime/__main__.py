import sys

from edge_runtime.cli import main

sys.exit(main())
