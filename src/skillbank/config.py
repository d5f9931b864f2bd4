"""Typed run configuration: one TOML file feeds the Python API, the CLI and the saved run record.

    methods    the methods to compare (skillbank.continual.methods.METHODS), default ["fsm"]
    [method_params.<name>]  a method's own hyperparameters (LwF temperature, EWC lambda, ...)
    [runner]   parallel FSM stages, whether to keep every stage's state
    [stream]   which benchmark stream and how much of it (source, path, seed, sizes)
    [base]     the frozen base model (skillbank.model.base.BaseModelConfig)
    [train]    one executor's LoRA recipe (skillbank.train.executor.TrainConfig)
    [address]  the Address Memory kind and its hyperparameters
    [eval]     task orders, generation cap and batch size

Unknown keys are errors (a typo must not silently fall back to a default). The resolved configuration
is written next to every run's results as ``config.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from skillbank.errors import SkillbankError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(SkillbankError, ValueError):
    """A run configuration file is missing, unparsable or invalid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamSettings(_Strict):
    source: Literal["builtin", "taskbench", "taskbench-hub", "dir"] = "builtin"
    path: Optional[str] = Field(None, description="TaskBench root (source=taskbench) or stream directory (source=dir)")
    seed: int = 0
    train_per_family: int = Field(1000, ge=1)
    test_per_family: Optional[int] = Field(None, ge=1, description="held-out requests per family; unset = all (built-in: 300)")


class BaseSettings(_Strict):
    name: str = "embedded"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    threads: Optional[int] = Field(None, ge=1)
    cache_dir: Optional[str] = None
    device: str = Field("auto", description="auto (CUDA when available), cpu, cuda or cuda:N")


class AddressSettings(_Strict):
    kind: str = "hashing-nb"
    params: dict = Field(default_factory=dict)


class EvalSettings(_Strict):
    orders: list[str] = Field(default_factory=lambda: ["O1"])
    max_new_tokens: int = Field(768, ge=1)
    batch_size: int = Field(8, ge=1)
    constrain: bool = Field(True, description="decode with the answering model's grammar: only the skills it "
                                              "learned and their declared arguments (skillbank.model.constrain)")

    @field_validator("orders")
    @classmethod
    def _non_empty(cls, v):
        if not v:
            raise ValueError("at least one order")
        return v


class RunnerSettings(_Strict):
    parallel_stages: int = Field(1, ge=1, description="FSM: train this many stages at once in worker processes "
                                                       "(its executors are independent given their data)")
    keep_states: bool = Field(False, description="keep every stage's method state (adapters) instead of the last")


class RunConfig(_Strict):
    name: str = "fsm"
    methods: list[str] = Field(default_factory=lambda: ["fsm"], description="methods to run, in this order")
    method_params: dict[str, dict] = Field(default_factory=dict, description="per-method hyperparameters")
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    base: BaseSettings = Field(default_factory=BaseSettings)
    train: dict = Field(default_factory=dict, description="TrainConfig fields; unset ones keep their defaults")
    address: AddressSettings = Field(default_factory=AddressSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    def base_config(self):
        from skillbank.model.base import BaseModelConfig
        return BaseModelConfig(**self.base.model_dump())

    def train_config(self):
        from skillbank.train.executor import TrainConfig
        return TrainConfig.from_dict(self.train)

    def method_params_for(self, name: str):
        """The typed hyperparameters of method ``name`` (defaults filled in)."""
        from skillbank.continual.methods import method_class
        cls = method_class(name)
        try:
            return cls.Params.model_validate(self.method_params.get(name, {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"[method_params.{name}] {loc}: {first['msg']} (got {first.get('input')!r})") from None

    def resolved(self) -> dict:
        """Everything, with the training recipe's and methods' defaults filled in (saved next to results)."""
        d = self.model_dump()
        d["train"] = self.train_config().to_dict()
        d["method_params"] = {m: self.method_params_for(m).model_dump() for m in self.methods}
        return d

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.resolved(), indent=1) + "\n")
        return path

    @classmethod
    def from_toml(cls, path: str | Path) -> "RunConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file")
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        return cls.from_dict(raw, where=str(path))

    @classmethod
    def from_run(cls, raw: dict, where: str = "config") -> "RunConfig":
        """A run directory's saved ``config.json``: runs made before constrained decoding existed decoded freely,
        so a missing ``eval.constrain`` reads as false there (not as the default for new configs)."""
        raw = {**raw, "eval": {"constrain": False, **raw.get("eval", {})}}
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: dict, where: str = "config") -> "RunConfig":
        try:
            cfg = cls.model_validate(raw)
            cfg.train_config()  # validate the recipe now, not an hour into a run
            for name in cfg.methods:
                cfg.method_params_for(name)
            stray = sorted(set(cfg.method_params) - set(cfg.methods))
            if stray:
                raise ConfigError(f"[method_params] names method(s) {stray} that are not in methods = {cfg.methods}")
            if len(set(cfg.methods)) != len(cfg.methods):
                raise ConfigError(f"methods lists a method twice: {cfg.methods}")
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{where}: {loc}: {first['msg']} (got {first.get('input')!r})") from None
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except SkillbankError as exc:
            raise ConfigError(f"{where}: [train] {exc}") from None
        return cfg


def packaged_config(name: str) -> Path:
    """Path of a config shipped inside the package (``demo``), so it works without a source checkout."""
    from importlib.resources import files
    path = Path(str(files("skillbank") / "resources" / f"{name}.toml"))
    if not path.is_file():
        raise ConfigError(f"no packaged config {name!r}")
    return path
