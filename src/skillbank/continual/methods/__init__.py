"""Continual-learning methods: FSM, the baselines and the frozen-base references (see ``base.Method``)."""
from skillbank.continual.methods.base import Method, MethodContext, MethodParams, Query
from skillbank.continual.methods.fsm import FSM
from skillbank.continual.methods.references import BaseOracleFields, BaseSkill
from skillbank.continual.methods.sequential import EWC, LwF, Replay, SequentialSFT
from skillbank.continual.methods.stacked import OLoRA, ProgressiveLoRA

METHODS: dict[str, type[Method]] = {m.name: m for m in (
    SequentialSFT, Replay, LwF, EWC, OLoRA, ProgressiveLoRA, FSM, BaseSkill, BaseOracleFields)}

__all__ = ["METHODS", "Method", "MethodContext", "MethodParams", "Query", "method_class"]


def method_class(name: str) -> type[Method]:
    from skillbank.config import ConfigError
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]
