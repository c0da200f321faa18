import sys

from delaylab.cli import main

sys.exit(main())
