"""Copy a run's or sweep's results without its weights: see :mod:`skillbank.continual.keep_results`.

    .venv/bin/python scripts/keep_results.py runs/sweep results/sweep
"""
import sys

from skillbank.continual.keep_results import main

if __name__ == "__main__":
    sys.exit(main())
