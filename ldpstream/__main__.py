import sys

from ldpstream.cli import main

sys.exit(main())
