"""The markdown report of an FSM run (``results.json`` -> ``report.md`` + heatmap PNGs)."""
from __future__ import annotations

from pathlib import Path

from skillbank.metrics import AccuracyMatrix
from skillbank.report.plots import matrix_heatmap, trajectories


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def write_fsm_report(record: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    labels = record["task_labels"]
    lines = [f"# FSM run: {record['config']['name']}", ""]
    cfg, t = record["config"], record["timing"]
    lines += [f"Base model `{record['base']['name']}` ({record['base'].get('parameters', 0) / 1e6:.0f}M parameters), "
              f"stream `{record['stream']['name']}`; LoRA r{cfg['train']['rank']} on {', '.join(cfg['train']['target_modules'])}, "
              f"{cfg['train']['epochs']} epoch(s), lr {cfg['train']['lr']}, batch {cfg['train']['batch_size']}x"
              f"{cfg['train']['grad_accum']}, target format `{cfg['train']['target_format']}`. "
              f"Greedy decoding, cap {cfg['eval']['max_new_tokens']} tokens.", "",
              f"Wall time {t['total_seconds'] / 60:.1f} min: base load {t['base_load_seconds']:.0f} s, training "
              f"{t['train_seconds']:.0f} s, generation {t['generate_seconds']:.0f} s ({t['generated_outputs']} outputs, "
              f"{t['generation_tokens_per_second']:.1f} tokens/s).", ""]
    lines += ["## Training", "", "| task | family | examples | epochs | steps | tokens/s | examples/s | final loss | seconds |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for fam, s in record["training"].items():
        lines.append(f"| {labels[fam]} | {fam} | {s['examples']} | {s['epochs']} | {s['steps']} | {s['tokens_per_second']:.0f} | "
                     f"{s['examples_per_second']:.2f} | {s['final_loss']:.3f} | {s['wall_seconds']:.0f} |")
    lines.append("")
    for name, res in record["orders"].items():
        order = res["order"]
        fsm, oracle = AccuracyMatrix.from_dict(res["fsm_em"]), AccuracyMatrix.from_dict(res["oracle_em"])
        sm = res["summary"]
        lines += [f"## Order {name}: {' -> '.join(labels[k] for k in order)}", "",
                  "Accuracy matrix a[t][k], graph EM (%): FSM (Address-routed), Oracle-routed in brackets.", "",
                  "| after stage | " + " | ".join(labels[k] for k in order) + " | macro | route acc |",
                  "|---|" + "---:|" * (len(order) + 2)]
        for ti in range(1, fsm.stages_done + 1):
            cells = []
            for k in order:
                v, o = fsm.get(ti, k), oracle.get(ti, k)
                cells.append("" if v is None else f"{_pct(v)} ({_pct(o)})")
            lines.append(f"| {labels[order[ti - 1]]} | " + " | ".join(cells) +
                         f" | {_pct(fsm.macro(ti))} ({_pct(oracle.macro(ti))}) | {_pct(res['route_micro'][ti - 1])} |")
        lines += ["", "Per task after the last stage (%):", "",
                  "| task | diagonal EM | final EM (FSM) | final EM (Oracle) | tool choice | argument F1 | route acc | retention |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        diag = fsm.diagonal()
        for k in order:
            m = res["final"][k]
            lines.append(f"| {labels[k]} {k} | {_pct(diag.get(k))} | {_pct(m['graph_em'])} | "
                         f"{_pct(res['final_oracle'][k]['graph_em'])} | {_pct(m['tool_choice'])} | {_pct(m['arg_f1'])} | "
                         f"{_pct(res['route'][-1].get(k))} | {_pct(sm['retention'].get(k))} |")
        lines += ["", f"- FSM final task-macro EM **{_pct(sm['fsm_macro_em'])}**, Oracle-routed **{_pct(sm['oracle_macro_em'])}** "
                  f"(FSM/Oracle = {_pct(sm['fsm_over_oracle'])}%)",
                  f"- macro diagonal EM {_pct(sm['diagonal_macro_em'])}; BWT {100 * sm['bwt']:+.2f} points "
                  f"(Oracle BWT {100 * sm['oracle_bwt']:+.2f}: frozen executors cannot forget, so any FSM BWT is routing)",
                  f"- route accuracy {_pct(sm['route_accuracy'])} (task-macro {_pct(sm['route_macro'])}); "
                  f"tool choice {_pct(sm['tool_choice'])}, argument F1 {_pct(sm['arg_f1'])} (task-macro)", ""]
        png = matrix_heatmap(fsm, [labels[k] for k in order], out / f"matrix_{name}.png",
                             f"FSM graph EM a[t][k] (%), order {name}; Oracle in brackets", reference=oracle)
        traj = trajectories({"FSM macro EM": [fsm.macro(i) for i in range(1, fsm.stages_done + 1)],
                             "Oracle macro EM": [oracle.macro(i) for i in range(1, oracle.stages_done + 1)],
                             "route accuracy": res["route_micro"]},
                            out / f"trajectory_{name}.png", f"order {name}", xlabels=[labels[k] for k in order])
        lines += [f"![accuracy matrix {name}]({png.name})", "", f"![trajectory {name}]({traj.name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
