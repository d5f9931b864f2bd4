"""Teaching a bank: validate and augment records, learn a new family, relearn one."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from skillbank.cli.common import err, friendly_errors, out, threads_option, use_threads
from skillbank.memory.lineage import DEFAULT_INIT, start_text


def _train_config(config: Optional[Path], epochs: Optional[int], target_format: Optional[str], recipe: str = "paper"):
    from skillbank.config import RunConfig
    from skillbank.train.recipes import RECIPES, train_config_for_recipe
    if recipe not in RECIPES:
        raise typer.BadParameter(f"--recipe must be 'auto', 'paper' or 'small-cpu', got {recipe!r}")
    overrides = dict(RunConfig.from_toml(config).train) if config else {}
    if epochs is not None:
        overrides["epochs"] = epochs
    if target_format is not None:
        overrides["target_format"] = target_format
    return train_config_for_recipe(recipe, overrides)


@friendly_errors
def validate(
    data: Path = typer.Option(..., help="Records (JSONL): one {\"id\", \"family\", \"request\", \"graph\"} per line."),
    catalog: Optional[Path] = typer.Option(None, help="Catalog: skillbank catalog.json, an OpenAI tools list or an MCP "
                                           "tools/list result (then --family names its one family)."),
    family: Optional[str] = typer.Option(None, help="Every record must belong to this family."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    negatives: Optional[Path] = typer.Option(None, help="A negatives file for `learn --negatives`, checked too."),
):
    """Check a records file the way `learn` does and report every bad line (file:line: reason). Lines with
    "graph": null are negatives (requests the family must refuse); one identical to a record's request is an error.

    Exit code 0 when every line is valid, 1 when some are not, 2 when the file or catalog cannot be read."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.negatives import read_negatives
    from skillbank.data.records import validate_records
    cat = load_catalog(catalog, family) if catalog else None
    v = validate_records(data, cat, family=family)
    if negatives is not None:
        from skillbank.errors import RecordError
        try:
            extra = read_negatives(negatives, family=family)
        except RecordError as exc:
            v.errors.append(exc)
        else:
            v.add_negatives(extra, negatives)
    if as_json:
        print(json.dumps({"path": v.path, "lines": v.lines, "valid": len(v.records), "negatives": len(v.negatives),
                          "ok": v.ok,
                          "errors": [{"line": e.line, "reason": e.reason} for e in v.errors]}, indent=1))
    else:
        for e in v.errors:
            print(e)
        print(v.summary())
    raise typer.Exit(0 if v.ok else 1)


@friendly_errors
def augment(
    data: Path = typer.Argument(..., help="Records (JSONL), e.g. one family's training records."),
    out_file: Path = typer.Option(..., "--out", help="Where to write the augmented records (JSONL)."),
    fraction: float = typer.Option(0.5, help="Share of records replaced by a styled version (same count, same "
                                   "training compute)."),
    copies: int = typer.Option(0, help="Styled copies added per record on top (more training compute)."),
    seed: int = typer.Option(0, help="Which records and which rewrites."),
    examples: int = typer.Option(3, help="How many before/after pairs to print."),
    compose: bool = typer.Option(False, "--compose", help="Compose instead of restyling: write the records and "
                                 "records made from them (values resampled, single steps joined; what `learn "
                                 "--compose` trains on), to read before you train."),
    compose_max: Optional[int] = typer.Option(None, min=0, help="With --compose: at most this many new records."),
):
    """Restyle training requests the way people type them (case, punctuation, politeness, fillers, connectors,
    shorthand, a typo), keeping every argument value verbatim; feed the output to `learn --data`.

    Every line is checked first (file:line on error; nothing is written then). The graphs are unchanged: only
    the surface of the request moves, so the executor learns to read other styles, not to invent values.
    Measured on the embedded base, training on the output did not help hand-written requests (README)."""
    from skillbank.data.augment import StyleAugment, augment_records
    from skillbank.data.records import read_records, write_records
    from skillbank.data.compose import Compose, compose_records
    if out_file.resolve() == data.resolve():
        raise typer.BadParameter("--out must differ from the input (the input would be lost)", param_hint="--out")
    # bad settings fail before reading
    settings = Compose(max_new=compose_max, seed=seed) if compose else \
        StyleAugment(fraction=fraction, copies=copies, seed=seed)
    records = read_records(data).records
    if not records:
        raise typer.BadParameter(f"{data} has no records")
    if compose:
        composed, report = compose_records(records, settings, examples=examples)
        write_records(out_file, composed)
        for kind, request in report.examples:
            out.print(f"[dim]{kind}:[/dim] {escape(request)}", highlight=False, soft_wrap=True)
        err.print(f"wrote {len(composed)} records to {out_file}: {report.summary()}", markup=False, highlight=False,
                  soft_wrap=True)
        return
    augmented, report = augment_records(records, settings, examples=examples)
    write_records(out_file, augmented)
    for before, after in report.examples:
        out.print(f"[dim]{before}[/dim]\n  -> {after}", highlight=False, soft_wrap=True)
    styles = ", ".join(f"{k} {v}" for k, v in report.styles.most_common())
    err.print(f"wrote {report.records_out} records to {out_file}: {report.replaced} replaced by a styled version, "
              f"{report.added} styled copies added, {report.unchanged} left as they were (no rewrite applied); "
              f"rewrites used: {styles}", markup=False, highlight=False, soft_wrap=True)


def _preflight_bank(bank: Path, family: str, records, cat) -> str | None:
    """What `learn` can refuse before loading a model: the bank's manifest, the family name, skills that
    another shard owns. Returns the bank's base model name (None when the bank does not exist yet)."""
    from skillbank.data.catalog import check_disjoint
    from skillbank.errors import BankError
    from skillbank.memory.bank import MANIFEST, check_family_name, read_manifest
    check_family_name(family)
    if not (bank / MANIFEST).exists():
        if bank.exists() and (not bank.is_dir() or any(bank.iterdir())):
            raise BankError(f"{bank} exists and is not a skill bank (no {MANIFEST}); choose a new directory")
        return None
    manifest = read_manifest(bank)
    if family in [s.name for s in manifest.shards]:
        raise BankError(f"family {family!r} is already in the bank; shards are write-once - learn it under a new name")
    declared = set(cat.family(family).skills) if cat is not None and family in cat.family_keys else \
        {t for r in records for t in r.graph.tasks}
    check_disjoint(declared, {s: e.name for e in manifest.shards for s in e.skills})
    return manifest.base["name"]


@friendly_errors
def learn(
    bank: Path = typer.Argument(..., help="The bank (created on first use)."),
    family: str = typer.Option(..., help="Name of the new skill family (becomes the shard name)."),
    data: Path = typer.Option(..., help="Stage records (JSONL): request + gold task graph."),
    catalog: Optional[Path] = typer.Option(None, help="The family's skills: skillbank catalog.json, an OpenAI tools "
                                           "list or an MCP tools/list result (default: the skills the records use)."),
    config: Optional[Path] = typer.Option(None, help="TOML with a \\[train] section (the LoRA recipe)."),
    epochs: Optional[int] = typer.Option(None, help="Override the number of epochs."),
    target_format: Optional[str] = typer.Option(None, help="'json' or 'compact' training targets."),
    recipe: str = typer.Option("auto", help="'auto' (small-cpu for bases under 1B parameters, the embedded one "
                               "included; paper otherwise), 'paper' (r16, lr 4e-4, 6 epochs, JSON targets) or "
                               "'small-cpu' (compact targets, lr 2e-3, 3 epochs: what a ~135M base on a CPU needs)."),
    base: str = typer.Option("embedded", help="Base model when the bank does not exist yet."),
    skip_invalid: bool = typer.Option(False, help="Skip bad record lines (and report them) instead of stopping."),
    checkpoint_minutes: float = typer.Option(10.0, min=0, help="Write the training's state this often into "
                                             "BANK/checkpoints/ (0: never); rerunning a killed learn with the same "
                                             "arguments continues from it."),
    init: str = typer.Option(DEFAULT_INIT, help="Where the new LoRA starts: 'fresh', 'neutral' (an adapter trained once "
                             "per base and recipe on invented families: no tie to any family), 'previous' (the last shard added), "
                             "'nearest' (the shard the Address Memory routes most of these records to), 'merge' "
                             "(the three nearest shards' updates summed, weighted by how much of these records the "
                             "Address Memory gives each; the default: the new shard then descends from them, and "
                             "`forget` of one of them asks about it) or 'shard:NAME' (a copy of that shard's weights; "
                             "same LoRA shape). 'fresh' (the paper's FSM) ties the shard to no other."),
    compose: bool = typer.Option(False, "--compose/--no-compose", help="Also train the executor on records "
                                 "composed from these: values resampled across records of the same skill and "
                                 "argument, single-step requests joined with the connectors and links your "
                                 "multi-step records show (values stay verbatim; the router reads your records only)."),
    compose_max: Optional[int] = typer.Option(None, min=0, help="At most this many composed records (default: as "
                                              "many as the records)."),
    negatives: Optional[Path] = typer.Option(None, help="Requests the family must refuse (JSONL, one {\"id\", "
                                             "\"family\", \"request\", \"kind\"} per line; lines of --data with "
                                             "\"graph\": null are negatives too): the scope gate refuses what "
                                             "looks more like them than like the family."),
    synthesize: Optional[bool] = typer.Option(None, "--synthesize/--no-synthesize", help="Also write negatives "
                                              "from the catalog and records (actions no skill performs on the "
                                              "family's objects, ...); default: when fewer than 30 are given. "
                                              "`skillbank scope negatives BANK FAMILY` lists them."),
    executor_refuses: bool = typer.Option(False, "--executor-refuses", help="Also train the executor on the "
                                          "negatives to write its refusal skill: a request the scope gate lets "
                                          "through but the executor refuses is answered out of scope (the second "
                                          "opinion; measured in docs/scope.md)."),
    threads: Optional[int] = threads_option(),
):
    """Learn a new skill family: train a LoRA on its records only, freeze it, update the Address Memory.

    Records, catalog and bank are checked first (the checks of `skillbank validate`, each record's family
    against --family included): a bad line stops it before any model is loaded or directory created. A learn
    killed during training continues from its last checkpoint when the same command is run again."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.records import validate_records
    from skillbank.errors import RecordError
    from skillbank.memory.bank import SkillBank
    from skillbank.memory.lineage import parse_init
    from skillbank.model.base import BaseModelConfig
    use_threads(threads)
    parse_init(init)  # a typo fails before any model is loaded
    cat = load_catalog(catalog, family) if catalog else None
    v = validate_records(data, cat, family=family)
    if negatives is not None:
        from skillbank.data.negatives import read_negatives
        v.add_negatives(read_negatives(negatives, family=family), negatives)  # a bad line stops here
    for e in v.errors:
        err.print(f"{'skipped ' if skip_invalid else ''}{e}", markup=False, highlight=False, soft_wrap=True)
    if v.errors and not skip_invalid:
        err.print(f"{v.summary()}; nothing learned (fix them, or pass --skip-invalid to learn from the valid ones)",
                  markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if v.errors:
        err.print(f"skipped {len(v.errors)} bad line(s) of {data}", markup=False, highlight=False)
    if not v.records:
        raise RecordError(f"no valid records for family {family!r}", data)
    bank_base = _preflight_bank(bank, family, v.records, cat)
    if recipe == "auto":
        from skillbank.train.recipes import recipe_for_base
        recipe, why = recipe_for_base(bank_base or base)
        err.print(f"recipe {recipe} (auto): {why}", markup=False, highlight=False, soft_wrap=True)
    else:
        err.print(f"recipe {recipe} (--recipe)", markup=False, highlight=False)
    cfg = _train_config(config, epochs, target_format, recipe)
    sb = SkillBank.open(bank) if bank_base is not None else SkillBank.create(bank, base_config=BaseModelConfig(name=base))
    checkpoint = None
    if checkpoint_minutes > 0:
        from skillbank.memory.bank import learn_checkpoint_path
        from skillbank.train.checkpoint import FitCheckpoint
        checkpoint = FitCheckpoint(learn_checkpoint_path(bank, family), every_seconds=60 * checkpoint_minutes)
    composition = None
    if compose:
        from skillbank.data.compose import Compose
        composition = Compose(max_new=compose_max)
    try:
        entry = sb.learn(family, v.records, cfg, catalog=cat, checkpoint=checkpoint, init=init, compose=composition,
                         negatives=v.negatives, synthesize=synthesize, executor_refuses=executor_refuses)
    except KeyboardInterrupt:
        if checkpoint is not None and checkpoint.path.is_file():
            err.print(f"interrupted: the training so far is in {checkpoint.path}; run the same command again to "
                      "continue from it", markup=False, highlight=False, soft_wrap=True)
        else:
            err.print("interrupted before any checkpoint was written: nothing learned", markup=False, highlight=False)
        raise typer.Exit(130)
    t = entry.training
    err.print(f"learned {family}: shard {entry.dir}, {len(entry.skills)} skills, {t['examples']} examples, "
              f"{t['wall_seconds']:.0f} s, {t['tokens_per_second']:.0f} tokens/s, final loss {t['final_loss']:.3f}, "
              f"started {start_text(entry.lineage)}")
    if t.get("augmentation"):
        from skillbank.data.compose import summary_text
        err.print(summary_text(t["augmentation"]), markup=False, highlight=False, soft_wrap=True)
    if t.get("refusal"):
        err.print(f"the executor was also trained to refuse: {t['refusal']['records']} negatives with the target "
                  f"{t['refusal']['skill']}", markup=False, highlight=False, soft_wrap=True)
    _say_negatives(sb, family, bank)


def _say_negatives(sb, family: str, bank: Path) -> None:
    held = sb.scope.negatives_.get(family, []) if sb.scope is not None else []
    if held:
        from skillbank.data.negatives import summary_text
        err.print(f"negatives for the scope gate: {summary_text(held)}; read them with `skillbank scope negatives "
                  f"{bank} {family}`", markup=False, highlight=False, soft_wrap=True)

@friendly_errors
def relearn(
    bank: Path = typer.Argument(..., help="The bank."),
    family: str = typer.Option(..., help="The family to retrain (its new version replaces the old one)."),
    data: Path = typer.Option(..., help="The family's records (JSONL), all of them: the old version's are not kept."),
    catalog: Optional[Path] = typer.Option(None, help="The family's catalog (default: the old version's skills)."),
    config: Optional[Path] = typer.Option(None, help="TOML with a \\[train] section (default: the old version's recipe)."),
    epochs: Optional[int] = typer.Option(None, help="Override the number of epochs."),
    init: str = typer.Option(DEFAULT_INIT, help="Where the new version starts: 'fresh', 'neutral', 'previous', 'nearest', "
                             "'merge' or 'shard:NAME' (as for `skillbank learn`; never the family's own old shard)."),
    descendants: str = typer.Option("refuse", help="Shards that started from the old version: 'refuse' (stop), "
                                    "'keep' (as they are) or 'forget' (forget them in the same publish)."),
    negatives: Optional[Path] = typer.Option(None, help="Requests the family must refuse (as for `learn`; default: "
                                             "the negatives the old version was given)."),
    synthesize: Optional[bool] = typer.Option(None, "--synthesize/--no-synthesize", help="As for `learn`."),
    threads: Optional[int] = threads_option(),
):
    """Train a new version of a family's shard on its records only and publish it atomically in its place."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.records import read_records
    from skillbank.memory.bank import SkillBank
    from skillbank.train.executor import TrainConfig
    use_threads(threads)
    cat = load_catalog(catalog) if catalog else None
    rs = read_records(data, cat, family=family)
    given = list(rs.negatives)
    if negatives is not None:
        from skillbank.data.negatives import read_negatives
        given += read_negatives(negatives, family=family)
    sb = SkillBank.open(bank)
    old = sb._entry(family)
    cfg = None
    if config or epochs is not None:
        cfg = _train_config(config, epochs, None, "paper") if config else TrainConfig.from_dict(
            {**old.training.get("config", {}), **({"epochs": epochs} if epochs is not None else {})})
    entry = sb.relearn(family, rs.records, cfg, catalog=cat, init=init, descendants=descendants, negatives=given,
                       synthesize=synthesize)
    err.print(f"relearned {family}: shard {entry.dir}, {entry.training['examples']} examples, "
              f"{entry.training['wall_seconds']:.0f} s")
    _say_negatives(sb, family, bank)
