"""skillbank: continual skill internalization with Factorized Skill Memory (FSM).

Address Memory (``skillbank.memory.address``) routes a raw request to one frozen executor shard of the
Execution Memory (``skillbank.memory.execution``); ``skillbank.memory.bank.SkillBank`` ties them together.

``from skillbank import SkillBank`` (and ``Catalog``, ``Record``, ``validate_records``) works, but the
names are imported on first use: ``import skillbank`` alone must stay cheap (the CLI's ``--version``,
the service's learner process), and the bank pulls in numpy and the selectors.
"""

__version__ = "0.1.0"

_LAZY = {
    "SkillBank": "skillbank.memory.bank",
    "Catalog": "skillbank.data.catalog",
    "Record": "skillbank.data.records",
    "validate_records": "skillbank.data.records",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'skillbank' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
