"""Two references on the frozen base (no training): how far in-context knowledge goes.

* :class:`BaseSkill` (Base + Skill) - the full skill catalog (every family's skill ids, descriptions and
  typed arguments) is written into the system prompt; the request is otherwise closed-book.
* :class:`BaseOracleFields` (Base + Oracle Address+Fields) - the request's gold skill ids, in order, and
  each one's argument names are appended to the request: what is left is filling values and links.

Both ask for the JSON contract (the paper's system instruction) and are decoded as JSON. Being frozen,
their outputs never change across stages or orders, so each request is generated once.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Sequence

from skillbank.data.records import Record
from skillbank.continual.methods.base import Method, Query
from skillbank.model.prompts import PAPER_SYSTEM_PROMPT, USER_TEMPLATE


def catalog_block(catalog) -> str:
    lines = ["Available skills:"]
    for fam in catalog.families:
        for sid in fam.skills:
            s = catalog.skills[sid]
            args = ", ".join(f"{a.name} ({a.type})" for a in s.arguments) or "none"
            desc = f" {s.description.strip()}" if s.description.strip() else ""
            lines.append(f"- {sid}:{desc} Arguments: {args}.")
    return "\n".join(lines)


def oracle_fields_block(record: Record, catalog) -> str:
    parts = []
    for sid in record.graph.tasks:
        skill = catalog.skills.get(sid)
        names = ", ".join(skill.argument_names) if skill is not None and skill.arguments else "none"
        parts.append(f"{sid} (arguments: {names})")
    return "Use exactly these skills, in this order: " + "; ".join(parts) + "."


class _FrozenBase(Method):
    trains = False
    order_independent = True
    STATE = "base"

    def learn(self, t, family, records) -> dict:
        return {"examples": 0, "wall_seconds": 0.0, "frozen_base": True}

    def model_for(self, state: str):
        peft = self.base.peft
        if peft is None:
            return nullcontext(self.base.model)
        return self._bare(peft)

    @contextmanager
    def _bare(self, peft):
        with peft.disable_adapter():
            yield peft

    def _render(self, system: str, user: str) -> str:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.base.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                       enable_thinking=False)


class BaseSkill(_FrozenBase):
    name = "base-skill"
    title = "Base + Skill"

    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        system = PAPER_SYSTEM_PROMPT + "\n\n" + catalog_block(self.ctx.stream.catalog)
        skills = tuple(self.ctx.stream.catalog.skills)  # the catalog it is shown
        return {self.name: [Query(self.STATE, self._render(system, USER_TEMPLATE.format(request=r.request.strip())),
                                  "json", "", skills=skills) for r in records]}


class BaseOracleFields(_FrozenBase):
    name = "base-oracle-fields"
    title = "Base + Oracle Address+Fields"

    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        catalog = self.ctx.stream.catalog
        out = []
        for r in records:
            user = USER_TEMPLATE.format(request=r.request.strip()) + "\n" + oracle_fields_block(r, catalog)
            out.append(Query(self.STATE, self._render(PAPER_SYSTEM_PROMPT, user), "json", "",
                             skills=tuple(catalog.skills)))
        return {self.name: out}
