import sys

from fedmtl.cli import main

sys.exit(main())
