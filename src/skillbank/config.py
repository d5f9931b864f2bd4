"""Typed run configuration: one TOML file feeds the Python API, the CLI and the saved run record.

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


class AddressSettings(_Strict):
    kind: str = "hashing-nb"
    params: dict = Field(default_factory=dict)


class EvalSettings(_Strict):
    orders: list[str] = Field(default_factory=lambda: ["O1"])
    max_new_tokens: int = Field(768, ge=1)
    batch_size: int = Field(8, ge=1)

    @field_validator("orders")
    @classmethod
    def _non_empty(cls, v):
        if not v:
            raise ValueError("at least one order")
        return v


class RunConfig(_Strict):
    name: str = "fsm"
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

    def resolved(self) -> dict:
        """Everything, with the training recipe's defaults filled in (what gets saved next to results)."""
        d = self.model_dump()
        d["train"] = self.train_config().to_dict()
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
    def from_dict(cls, raw: dict, where: str = "config") -> "RunConfig":
        try:
            cfg = cls.model_validate(raw)
            cfg.train_config()  # validate the recipe now, not an hour into a run
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{where}: {loc}: {first['msg']} (got {first.get('input')!r})") from None
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
