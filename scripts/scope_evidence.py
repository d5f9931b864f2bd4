"""What else could tell in-scope from out-of-scope requests: see :mod:`skillbank.experiments.scope_evidence`."""
from skillbank.experiments.scope_evidence import main

if __name__ == "__main__":
    main()
