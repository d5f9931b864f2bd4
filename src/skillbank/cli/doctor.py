"""`skillbank doctor`: what this machine gives skillbank - CPU, threads, engines, and the encodings timed here."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console

from skillbank.cli.common import friendly_errors, threads_option

out = Console(soft_wrap=True, highlight=False)


@friendly_errors
def doctor(threads: Optional[int] = threads_option("The thread count to report and time the encodings for "
                                                   "(default: what a command not told would use)."),
           remeasure: bool = typer.Option(False, "--remeasure", help="Time llama.cpp's encodings again, even where a "
                                          "choice for this CPU, llama.cpp version and thread count is cached."),
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Show this machine's CPU, the threads commands compute with, and which llama.cpp encoding serves each batch
    width (timed here once, cached; --remeasure times again)."""
    from skillbank.model import llamacpp
    from skillbank.model.encoding_choice import cache_path, cpu_identity, forced_encoding, measured_choice
    from skillbank.model.threads import default_threads, threads_reason

    n = threads or default_threads()
    report: dict = {"cpu": cpu_identity(), "threads": n, "threads_why": threads_reason(threads)}
    problem = llamacpp.available()
    report["llama_cpp"] = problem or llamacpp.cpu_features().strip()
    if problem is None:
        choice = measured_choice(n, remeasure=remeasure)
        report["encodings"] = choice.to_json()
        report["encodings_why"] = choice.why()
        report["encoding_forced"] = forced_encoding()
        report["encodings_cache"] = str(cache_path())
    if as_json:
        print(json.dumps(report, indent=1))
        return
    out.print(f"CPU:       {report['cpu']}")
    out.print(f"threads:   {report['threads_why']}")
    if problem is not None:
        out.print(f"llama.cpp: unavailable ({problem}); plans use the torch engine")
        return
    out.print(f"llama.cpp: {choice.llama_cpp} ({report['llama_cpp']})")
    when = f"measured {choice.measured_at} in {choice.seconds:.0f} s" if not choice.failed else choice.measured_at
    out.print(f"encodings of merged models ({when}; cached in {report['encodings_cache']}):")
    for line in choice.why().splitlines():
        out.print(f"  {line}")
    if report["encoding_forced"]:
        out.print(f"  forced for every width by $SKILLBANK_LLAMACPP_ENCODING={report['encoding_forced']}")
