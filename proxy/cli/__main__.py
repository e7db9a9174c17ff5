"""``python -m proxy.cli``: the ``compact-proxy`` command."""

import sys

from proxy.cli.commands import main

sys.exit(main())
