"""The lab: one module per study, each runnable as ``python -m skillbank.experiments.<study>`` (the scripts/
folder keeps thin wrappers under the old names). Studies compute; :mod:`skillbank.report` renders."""
