"""The lab: one module per study. Each computes its results and writes them, with the command and the git
commit that produced them (:mod:`skillbank.experiments.provenance`), into its results directory;
:mod:`skillbank.report` only renders them. ``skillbank exp ...`` is the command line of these studies.

- :mod:`.routing`: the one route-evaluation loop (:func:`~.routing.route_prefixes`) and ``exp route-eval``
- :mod:`.route_scale`: routing accuracy and latency as the number of families grows (``exp route-scale``)
- :mod:`.selectors`: every selector over one frozen bank, route accuracy and EM (``exp selectors``)
- :mod:`.decoding`: free vs constrained decoding over one bank (``exp decoding``)
- :mod:`.scope`: out-of-scope detection, kept vs refused (``exp scope``)
- :mod:`.scope_evidence`: which evidence separates in-scope from out-of-scope (``python -m``, scripts/)

The continual-learning harness (``exp run | sweep | reactivate | diagnose``) is :mod:`skillbank.continual`."""
