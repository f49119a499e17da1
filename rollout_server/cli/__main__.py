import sys

from rollout_server.cli import main

sys.exit(main())
