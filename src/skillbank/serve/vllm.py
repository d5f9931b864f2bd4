"""``skillbank export vllm``: the vLLM OpenAI server command that serves a bank's shards as LoRA modules.

Every shard is already a plain PEFT adapter directory, so vLLM loads it unchanged; the command names each
shard after its family (the model name ``skillbank serve --upstream`` sends), sets ``--max-lora-rank`` to the
largest rank in the bank (rounded up to a rank vLLM accepts), ``--max-loras`` (shards one GPU batch may mix)
to the number of shards up to ``GPU_LORA_SLOTS`` and ``--max-cpu-loras`` (shards kept in host memory, least
recently used evicted; the rest load from disk on demand) up to ``CPU_LORA_CACHE``: a bank of a thousand
families does not reserve a thousand GPU slots. Structured outputs use the llguidance backend, so each request
is decoded under its shard's grammar there too.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from skillbank.errors import BankError
from skillbank.memory.bank import read_manifest

# The LoRA ranks vLLM's --max-lora-rank accepts (vllm/config/lora.py).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM reserves GPU memory for --max-loras adapters of --max-lora-rank in every LoRA layer; a batch rarely
# holds more distinct shards than this, and requests for a shard not in a slot wait for one.
GPU_LORA_SLOTS = 16
CPU_LORA_CACHE = 128


@dataclass(frozen=True)
class VllmPlan:
    base: str
    lora_modules: dict[str, str]  # shard name -> absolute adapter directory
    max_lora_rank: int
    max_loras: int
    command: list[str]
    max_cpu_loras: int = 0
    notes: tuple[str, ...] = ()

    def shell(self) -> str:
        return shlex.join(self.command)

    def script(self) -> str:
        """A shell script running the command, one flag (with its values) per line for reading."""
        parts, i, cmd = [], 0, self.command
        while i < len(cmd):
            j = i + 1
            if cmd[i].startswith("--"):
                while j < len(cmd) and not cmd[j].startswith("--"):
                    j += 1
            elif i < 2:  # "vllm serve BASE" stays on the first line
                j = 3
            parts.append(" ".join(shlex.quote(a) for a in cmd[i:j]))
            i = j
        return ("#!/bin/sh\n# vLLM OpenAI server for this skill bank (written by `skillbank export vllm`).\n"
                "# Then: skillbank serve BANK --upstream http://HOST:PORT\nexec " + " \\\n  ".join(parts) + "\n")

    def to_dict(self) -> dict:
        return {"base": self.base, "lora_modules": self.lora_modules, "max_lora_rank": self.max_lora_rank,
                "max_loras": self.max_loras, "max_cpu_loras": self.max_cpu_loras, "notes": list(self.notes),
                "command": self.command, "shell": self.shell()}


def adapter_rank(directory: Path) -> int:
    """The largest LoRA rank of an adapter directory (``r`` and any per-module ``rank_pattern``)."""
    path = directory / "adapter_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BankError(f"cannot read {path}: {exc}") from None
    ranks = [int(cfg.get("r") or 0)] + [int(v) for v in (cfg.get("rank_pattern") or {}).values()]
    return max(ranks)


def base_location(name: str) -> str:
    """Where vLLM finds the base: the converted embedded model's directory, a local directory, or a hub id."""
    if name == "embedded":
        from skillbank.model.base import ensure_embedded
        return str(ensure_embedded().resolve())
    local = Path(name).expanduser()
    return str(local.resolve()) if local.is_dir() else name


def vllm_plan(bank: str | Path, *, host: str = "127.0.0.1", port: int = 8001, base: str | None = None,
              extra: list[str] | None = None) -> VllmPlan:
    root = Path(bank).resolve()
    manifest = read_manifest(root)
    if not manifest.shards:
        raise BankError(f"{root} has no shards yet; learn a family first")
    modules = {s.name: str(root / s.dir) for s in manifest.shards}
    rank = max(adapter_rank(Path(p)) for p in modules.values())
    vllm_rank = next((r for r in VLLM_RANKS if r >= rank), None)
    if vllm_rank is None:
        raise BankError(f"{root}: LoRA rank {rank} is above what vLLM serves (at most {VLLM_RANKS[-1]})")
    where = base or base_location(manifest.base["name"])
    max_loras, max_cpu = min(len(modules), GPU_LORA_SLOTS), min(len(modules), CPU_LORA_CACHE)
    notes = []
    if len(modules) > GPU_LORA_SLOTS:
        notes.append(f"{len(modules)} shards: --max-loras {max_loras} GPU slots (a batch mixes at most that many "
                     f"shards) and --max-cpu-loras {max_cpu} in host memory; the others load from disk when "
                     "requested. Raise them if GPU and host memory allow.")
    command = ["vllm", "serve", where, "--host", host, "--port", str(port), "--enable-lora",
               "--lora-modules", *(f"{name}={path}" for name, path in modules.items()),
               "--max-lora-rank", str(vllm_rank), "--max-loras", str(max_loras), "--max-cpu-loras", str(max_cpu),
               # The grammars `skillbank serve --upstream` sends (structured_outputs.grammar) are Lark, which
               # vLLM's llguidance backend ("guidance") reads; vLLM >= 0.10.2.
               "--structured-outputs-config.backend", "guidance", *(extra or [])]
    return VllmPlan(where, modules, vllm_rank, max_loras, command, max_cpu, tuple(notes))
