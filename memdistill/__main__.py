import sys

from memdistill.cli import main

sys.exit(main())
