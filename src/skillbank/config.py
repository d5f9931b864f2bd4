"""Typed run configuration: one TOML file feeds the Python API, the CLI and the saved run record.

    methods    the methods to compare (names in skillbank.method_registry), default ["fsm"]
    [method_params.<name>]  a method's own hyperparameters (LwF temperature, EWC lambda, ...)
    [runner]   parallel FSM stages, whether to keep every stage's state
    [stream]   which benchmark stream and how much of it (source, path, seed, sizes)
    [base]     the frozen base model (skillbank.model.base.BaseModelConfig)
    [train]    one executor's LoRA recipe (skillbank.train.executor.TrainConfig), shared by every method
    [method_train.<name>]  [train] fields one method overrides (a learning rate tuned for it by the sweep)
    [address]  the Address Memory kind and its hyperparameters
    [eval]     task orders, generation cap and batch size, the split evaluated (test, or validation for tuning)
    [sweep]    sweep configs only (SweepConfig, ``skillbank exp sweep``): screens and each method's grid

Unknown keys are errors (a typo must not silently fall back to a default). The resolved configuration
is written next to every run's results as ``config.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from skillbank.errors import SkillbankError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(SkillbankError, ValueError):
    """A run configuration file is missing, unparsable or invalid."""


def _read_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # TOML is UTF-8; -sig: a byte-order mark
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}; "
                          "TOML is UTF-8)") from None


def _invalid(exc: ValidationError, head: str) -> ConfigError:
    """The first validation error as ``<head><field.path>: <message> (got <value>)``."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return ConfigError(f"{head}{loc}: {first['msg']} (got {first.get('input')!r})")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamSettings(_Strict):
    source: Literal["builtin", "taskbench", "taskbench-hub", "dir"] = "builtin"
    path: Optional[str] = Field(None, description="TaskBench root (source=taskbench) or stream directory (source=dir)")
    seed: int = 0
    train_per_family: int = Field(1000, ge=1)
    test_per_family: Optional[int] = Field(None, ge=1, description="held-out requests per family; unset = all (built-in: 300)")
    validation_per_family: Optional[int] = Field(None, ge=1, description="training requests per family moved to a "
                                                 "validation split (seeded, never a held-out request); unset = none")
    validation_fraction: Optional[float] = Field(None, gt=0, lt=1, description="the same as a fraction of each "
                                                 "family's training requests (instead of validation_per_family)")

    @model_validator(mode="after")
    def _one_validation_size(self):
        if self.validation_per_family is not None and self.validation_fraction is not None:
            raise ValueError("give validation_per_family or validation_fraction, not both")
        return self

    @property
    def has_validation(self) -> bool:
        return self.validation_per_family is not None or self.validation_fraction is not None


class BaseSettings(_Strict):
    name: str = "embedded"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="auto: bfloat16 where the device multiplies it natively (CUDA, AVX-512 "
                               "CPUs), float32 elsewhere")
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
    split: Literal["test", "validation"] = Field("test", description="which requests each stage is evaluated on: "
                                                 "the held-out test set, or the validation split carved from the "
                                                 "training requests ([stream] validation_per_family), for tuning")
    engine: Literal["auto", "llama.cpp", "torch"] = Field("auto", description=(
        "what generates the outputs evaluated (skillbank.continual.engines): llama.cpp, the product's path, on the "
        "method's update merged into the embedded base; torch, the reference decoder; auto: llama.cpp where it can "
        "run the base on this machine's CPU (the embedded model, llama-cpp-python installed, no GPU in use), else "
        "torch. Resolved when the run starts and saved with it: part of a run's identity"))
    llamacpp_encoding: Literal["auto", "q8_0", "bf16"] = Field("auto", description=(
        "how the llama.cpp engine stores the merged models it evaluates with (skillbank.model.llamacpp.encoding_for):"
        " auto, the batched encoding of this machine (the one timed fastest at 16 rows a pass here, Q8_0 or BF16), "
        "resolved when the run starts, saved with it and kept when it is resumed, on any machine (the two "
        "round differently: a run never mixes them; naming another for a started run is refused); q8_0 or bf16 to "
        "choose. Unused by the torch engine"))
    extra_sets: list[str] = Field(default_factory=list, description=(
        "JSONL record files of the stream's families written elsewhere (by hand, or real traffic), a path relative "
        "to the current directory; every method is also evaluated on each after its last stage, routed as on the "
        "held-out requests. Template held-out EM says how well a method learned its stream; these say how it "
        "meets requests phrased as people phrase them. Outside a run's identity: adding a set to a finished run "
        "evaluates only that set"))

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
    checkpoint_minutes: float = Field(10.0, ge=0, description="write a checkpoint inside each stage's training this "
                                                              "often, so a killed process continues the stage where "
                                                              "it stopped (0: off); not part of a run's identity")


class SweepSettings(_Strict):
    """``[sweep]``: a hyperparameter screen (``skillbank exp sweep``, :mod:`skillbank.continual.sweep`).

    ``grid.<method>`` is one block (``[sweep.grid.lwf]``) or several (``[[sweep.grid.olora]]``); a block maps
    each of the method's own parameters, and under ``train.`` each [train] field, to a list of values (an
    axis) or one value (fixed); its points are the product of its axes, in the order written, and a
    method's grid is its blocks' points one after another. A list-valued parameter (``target_modules``)
    takes a list as one value and a list of lists as an axis. Names and values are checked by the sweep
    before any training."""
    orders: list[str] = Field(default_factory=lambda: ["O1", "O2"], description="each order's first `stages` "
                                                                                 "families are one screen")
    stages: int = Field(2, ge=2, description="stages per screen (2: each order's first transition)")
    grid: dict[str, list[dict]] = Field(default_factory=dict, description="method -> blocks of axes")

    @field_validator("grid", mode="before")
    @classmethod
    def _blocks(cls, v):
        if isinstance(v, dict):
            return {m: [b] if isinstance(b, dict) else b for m, b in v.items()}
        return v

    @field_validator("orders")
    @classmethod
    def _some_order(cls, v):
        if not v:
            raise ValueError("at least one order")
        return v


class RunConfig(_Strict):
    name: str = "fsm"
    methods: list[str] = Field(default_factory=lambda: ["fsm"], description="methods to run, in this order")
    method_params: dict[str, dict] = Field(default_factory=dict, description="per-method hyperparameters")
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    base: BaseSettings = Field(default_factory=BaseSettings)
    train: dict = Field(default_factory=dict, description="TrainConfig fields; unset ones keep their defaults")
    method_train: dict[str, dict] = Field(default_factory=dict, description="per-method overrides of [train] "
                                                                             "fields (e.g. a tuned lr)")
    address: AddressSettings = Field(default_factory=AddressSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    def base_config(self):
        from skillbank.model.base import BaseModelConfig
        return BaseModelConfig(**self.base.model_dump())

    def train_config(self):
        """The shared recipe ([train]), without any method's overrides."""
        from skillbank.train.executor import TrainConfig
        return TrainConfig.from_dict(self.train)

    def train_config_for(self, name: str):
        """Method ``name``'s recipe: [train] with its [method_train.<name>] fields on top. The budget (requests,
        epochs) is the shared one unless a config overrides it on purpose; the sweep only tunes lr here."""
        from skillbank.train.executor import TrainConfig
        return TrainConfig.from_dict({**self.train, **self.method_train.get(name, {})})

    def method_params_for(self, name: str):
        """The typed hyperparameters of method ``name`` (defaults filled in). The name resolves through the
        method registry (``skillbank.method_registry``), imported on use; it names each method by
        module path, imports only that method's module, and never imports this one (no import cycle)."""
        from skillbank.method_registry import UnknownMethodError, method_class
        try:
            cls = method_class(name)
        except UnknownMethodError as exc:
            raise ConfigError(str(exc)) from None
        try:
            return cls.Params.model_validate(self.method_params.get(name, {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])  # empty for a check across fields
            where = f"[method_params.{name}] {loc}" if loc else f"[method_params.{name}]"
            msg = first["msg"].removeprefix("Value error, ")  # a check across fields: its own message
            raise ConfigError(f"{where}: {msg} (got {first.get('input')!r})") from None

    def resolved(self) -> dict:
        """Everything, with the training recipe's and methods' defaults filled in (saved next to results)."""
        d = self.model_dump()
        d["train"] = self.train_config().to_dict()
        d["method_params"] = {m: self.method_params_for(m).model_dump() for m in self.methods}
        d["method_train"] = {m: dict(v) for m, v in self.method_train.items() if v}
        d["eval"]["engine"] = self.eval_engine()
        d["eval"]["llamacpp_encoding"] = self.eval_encoding(d["eval"]["engine"])
        return d

    def eval_encoding(self, engine: str | None = None) -> str:
        """``[eval] llamacpp_encoding`` resolved: "auto" is the batched encoding of this machine when the llama.cpp
        engine generates (``engine``, default :meth:`eval_engine`), and stays "auto" (unused) for torch."""
        if self.eval.llamacpp_encoding != "auto" or (engine or self.eval_engine()) != "llama.cpp":
            return self.eval.llamacpp_encoding
        from skillbank.model.llamacpp import encoding_for

        return encoding_for(16, self.base.threads)

    def eval_engine(self) -> str:
        """``[eval] engine`` resolved for this machine: "llama.cpp" or "torch" (``skillbank.continual.engines``).
        "auto" takes llama.cpp where it runs the base on this CPU; an explicit "llama.cpp" that cannot run it is a
        :class:`ConfigError` naming why."""
        from skillbank.model.llamacpp import base_problem

        choice = self.eval.engine
        if choice == "torch":
            return "torch"
        if choice == "auto" and self.base.device != "cpu":
            if self.base.device != "auto":
                return "torch"  # a GPU named: it generates faster than llama.cpp's CPU build
            import torch
            if torch.cuda.is_available():
                return "torch"
        problem = base_problem(self.base.name)
        if problem is None:
            return "llama.cpp"
        if choice == "llama.cpp":
            raise ConfigError(f"[eval] engine = \"llama.cpp\" cannot be used: {problem}")
        return "torch"

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(self.resolved(), indent=1) + "\n")
        return path

    @classmethod
    def from_toml(cls, path: str | Path) -> "RunConfig":
        return cls.from_dict(_read_toml(path), where=str(path))

    @classmethod
    def from_run(cls, raw: dict, where: str = "config") -> "RunConfig":
        """A run directory's saved ``config.json``: runs made before constrained decoding existed decoded freely,
        and those made before ``[eval] engine`` existed generated with torch, so a missing ``eval.constrain`` reads
        as false and a missing ``eval.engine`` as "torch" there (not as the defaults for new configs); a missing
        ``eval.llamacpp_encoding`` as :func:`saved_encoding` says."""
        raw = {**raw, "eval": {"constrain": False, "engine": "torch", **raw.get("eval", {})}}
        raw["eval"].setdefault("llamacpp_encoding", saved_encoding(raw))
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: dict, where: str = "config") -> "RunConfig":
        try:
            cfg = cls.model_validate(raw)
            cfg.train_config()  # validate the recipe now, not an hour into a run
            for name in cfg.methods:
                cfg.method_params_for(name)
            for section, named in (("method_params", cfg.method_params), ("method_train", cfg.method_train)):
                stray = sorted(set(named) - set(cfg.methods))
                if stray:
                    raise ConfigError(f"[{section}] names method(s) {stray} that are not in methods = {cfg.methods}")
            for name in cfg.method_train:
                try:
                    cfg.train_config_for(name)
                except SkillbankError as exc:
                    raise ConfigError(f"[method_train.{name}] {exc}") from None
            if len(set(cfg.methods)) != len(cfg.methods):
                raise ConfigError(f"methods lists a method twice: {cfg.methods}")
            if cfg.runner.parallel_stages > 1 and "fsm" in cfg.methods:
                from skillbank.method_registry import method_class
                fsm = cfg.method_params_for("fsm")
                if not method_class("fsm").independent_of_order(fsm.model_dump()):
                    raise ConfigError(f"[runner] parallel_stages = {cfg.runner.parallel_stages} needs executors "
                                      f"that do not depend on each other; [method_params.fsm] init = {fsm.init!r} "
                                      "starts each from earlier ones (set parallel_stages = 1, or init = 'fresh' "
                                      "or 'neutral')")
            if cfg.eval.split == "validation" and not cfg.stream.has_validation:
                raise ConfigError("[eval] split = 'validation' needs a validation split: set [stream] "
                                  "validation_per_family (or validation_fraction)")
        except ValidationError as exc:
            raise _invalid(exc, f"{where}: ") from None
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except SkillbankError as exc:
            raise ConfigError(f"{where}: [train] {exc}") from None
        return cfg


class SweepConfig(BaseModel):
    """A sweep file: a run configuration (the shared recipe: stream, base, [train], ...) plus ``[sweep]``.
    ``methods`` defaults to the grid's methods; [method_params] there are every grid point's fixed base."""
    model_config = ConfigDict(arbitrary_types_allowed=True)
    run: RunConfig
    sweep: SweepSettings

    @classmethod
    def from_toml(cls, path: str | Path) -> "SweepConfig":
        return cls.from_dict(_read_toml(path), where=str(path))

    @classmethod
    def from_dict(cls, raw: dict, where: str = "config") -> "SweepConfig":
        raw = dict(raw)
        if "sweep" not in raw:
            raise ConfigError(f"{where}: no [sweep] section (a sweep config is a run config plus [sweep]; "
                              f"see configs/sweep.toml)")
        try:
            sweep = SweepSettings.model_validate(raw.pop("sweep"))
        except ValidationError as exc:
            raise _invalid(exc, f"{where}: [sweep] ") from None
        if not sweep.grid:
            raise ConfigError(f"{where}: [sweep] has no grid (add [sweep.grid.<method>] blocks)")
        from skillbank.method_registry import UnknownMethodError, method_class
        for method in sweep.grid:
            try:
                method_class(method)
            except UnknownMethodError as exc:
                raise ConfigError(f"{where}: [sweep.grid.{method}]: {exc}") from None
        raw.setdefault("methods", list(sweep.grid))
        return cls(run=RunConfig.from_dict(raw, where=where), sweep=sweep)

    def with_threads(self, threads: int) -> "SweepConfig":
        """The same sweep with ``[base] threads`` set (how fast it runs, not what it learns)."""
        base = self.run.base.model_copy(update={"threads": threads})
        return self.model_copy(update={"run": self.run.model_copy(update={"base": base})})


def saved_encoding(saved: dict) -> str:
    """The llama.cpp encoding a run directory's saved configuration generated with: the one it records, else Q8_0
    for a llama.cpp run (the only encoding before BF16 existed) and "auto" (unused) for a torch one."""
    evaluation = saved.get("eval", {})
    if "llamacpp_encoding" in evaluation:
        return evaluation["llamacpp_encoding"]
    return "q8_0" if evaluation.get("engine") == "llama.cpp" else "auto"


def packaged_config(name: str) -> Path:
    """Path of a config shipped inside the package (``demo``), so it works without a source checkout."""
    from importlib.resources import files
    path = Path(str(files("skillbank") / "resources" / f"{name}.toml"))
    if not path.is_file():
        raise ConfigError(f"no packaged config {name!r}")
    return path
