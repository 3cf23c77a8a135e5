"""`python -m tensorfold.cli`: the `tensorfold` command without its installed script."""
import sys

from tensorfold.cli.main import main

sys.exit(main())
