import sys

from dice.cli import main

sys.exit(main())
