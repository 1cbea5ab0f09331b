import sys

from comet.cli import main

sys.exit(main())
