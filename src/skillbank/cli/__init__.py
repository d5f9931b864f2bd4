"""The ``skillbank`` command: a thin layer over the Python API, one module per noun.

The top level holds what a user of a bank does (create, learn, plan, serve, forget, ...); the research
work (the continual harness, sweeps, routing and decoding studies, benchmark streams) sits under
``skillbank exp``. The whole command tree is assembled here, so this file is its table of contents::

    skillbank create BANK && skillbank learn BANK --family F --data records.jsonl
    skillbank plan BANK "what's the weather in Paris"
    skillbank exp stream build --source builtin --out streams/builtin
    skillbank exp route-eval --stream streams/builtin --order O1 --order O2

Progress and status go to stderr; ``--json`` prints machine-readable results on stdout. Library errors
(:class:`skillbank.errors.SkillbankError`) become one-line messages and exit code 2, no traceback. The
command names of the previous release (``route-scale``, ``export-family``, ``decoding-eval``, ...) still work
as hidden aliases that print one deprecation line on stderr.
"""
from __future__ import annotations

import sys

import typer

from skillbank.cli import bank, doctor, exp_routing, exp_runs, exp_studies, learn, plan, serve, stream
from skillbank.cli.common import deprecated

HELP = "Continual skill internalization: a skill bank of frozen LoRA executors and an Address Memory that routes."

app = typer.Typer(help=HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version
        print(f"skillbank {version('skillbank')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Continual skill internalization: a skill bank of frozen LoRA executors and an Address Memory that routes."""


def _group(help_: str) -> typer.Typer:
    return typer.Typer(help=help_, no_args_is_help=True)


# -- the bank's verbs -----------------------------------------------------------------------------
app.command()(bank.create)
app.command()(learn.learn)
app.command()(learn.validate)
app.command()(learn.augment)
app.command()(plan.plan)
app.command()(bank.info)
app.command()(bank.skills)
app.command()(bank.forget)
app.command()(learn.relearn)
export_app = _group("Export a family for another bank, or a bank for another serving stack.")
export_app.command("family")(bank.export_family)
export_app.command("vllm")(serve.export_vllm)
app.add_typer(export_app, name="export")
app.command("import")(bank.import_family)
scope_app = _group("Out-of-scope detection: requests no learned family covers.")
scope_app.command("fit")(bank.scope_fit)
scope_app.command("negatives")(bank.scope_negatives)
app.add_typer(scope_app, name="scope")
app.command()(serve.serve)
app.command()(plan.score)
app.command()(exp_runs.demo)
app.command()(doctor.doctor)

# -- the lab --------------------------------------------------------------------------------------
exp_app = _group("Research: continual-learning runs, sweeps, routing, decoding and scope studies, streams.")
exp_app.command()(exp_runs.run)
exp_app.command()(exp_runs.sweep)
exp_app.command()(exp_runs.report)
exp_app.command()(exp_runs.progress)
exp_app.command()(exp_runs.diagnose)
exp_app.command()(exp_runs.reactivate)
exp_app.command("route-eval")(exp_routing.route_eval)
exp_app.command("route-scale")(exp_routing.route_scale)
exp_app.command("selectors")(exp_routing.selectors)
exp_app.command("decoding")(exp_studies.decoding)
exp_app.command("scope")(exp_studies.scope)
stream_app = _group("Build and inspect benchmark streams.")
stream_app.command("build")(stream.build)
stream_app.command("info")(stream.info)
exp_app.add_typer(stream_app, name="stream")
app.add_typer(exp_app, name="exp")

# -- the previous release's names: hidden, one deprecation line each, removed in the next release ----
for old, new, fn in [("route-eval", "exp route-eval", exp_routing.route_eval),
                     ("route-scale", "exp route-scale", exp_routing.route_scale),
                     ("selectors", "exp selectors", exp_routing.selectors),
                     ("decoding-eval", "exp decoding", exp_studies.decoding),
                     ("run", "exp run", exp_runs.run), ("sweep", "exp sweep", exp_runs.sweep),
                     ("report", "exp report", exp_runs.report), ("progress", "exp progress", exp_runs.progress),
                     ("reactivate", "exp reactivate", exp_runs.reactivate),
                     ("diagnose", "exp diagnose", exp_runs.diagnose),
                     ("export-family", "export family", bank.export_family),
                     ("import-family", "import", bank.import_family)]:
    app.command(old, hidden=True)(deprecated(fn, old, new))
scope_app.command("eval", hidden=True)(deprecated(exp_studies.scope, "scope eval", "exp scope"))
old_stream = typer.Typer(help="Build and inspect benchmark streams.", no_args_is_help=True, hidden=True)
old_stream.command("build")(deprecated(stream.build, "stream build", "exp stream build"))
old_stream.command("info")(deprecated(stream.info, "stream info", "exp stream info"))
app.add_typer(old_stream, name="stream", hidden=True)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
