"""Training one executor: a fresh LoRA adapter fitted to one stage's records (see ``executor``)."""
from skillbank.train.executor import TrainConfig, TrainSummary, freeze_all, top_layers, train_executor

__all__ = ["TrainConfig", "TrainSummary", "train_executor", "freeze_all", "top_layers"]
