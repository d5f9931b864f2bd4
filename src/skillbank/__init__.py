"""skillbank: continual skill internalization with Factorized Skill Memory (FSM).

Address Memory (``skillbank.memory.address``) routes a raw request to one frozen executor shard of the
Execution Memory (``skillbank.memory.execution``); ``skillbank.memory.bank.SkillBank`` ties them together.
"""

__version__ = "0.1.0"
