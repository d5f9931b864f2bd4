"""Free vs constrained decoding, rendered: the markdown tables and the figure of
:mod:`skillbank.experiments.decoding`'s results."""
from __future__ import annotations

from pathlib import Path

from skillbank.metrics import FAILURE_KINDS, FAILURE_TITLES


def render_markdown(result: dict) -> str:
    lines = [f"# Free vs constrained decoding - bank `{result['bank']}`", ""]
    for set_name, entry in result["sets"].items():
        modes = list(entry["modes"])
        cov = entry["copy_coverage"]
        lines += [f"## {set_name} ({entry['n']} requests)", "",
                  f"Gold graphs whose literal values all occur in the request: {cov['records_all_copied']}/"
                  f"{cov['records']} ({cov['values_copied']}/{cov['values']} values).", "",
                  "| measure | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
        rows = [("graph EM", "em", "{:.1f}"), ("route accuracy", "route_accuracy", "{:.1f}"),
                ("unparsable (not at the cap)", "unparsed", "{}"), ("hit the token cap", "token_cap", "{}"),
                ("skill outside the routed shard", "skill_outside_shard", "{}"),
                ("skill outside the bank", "skill_outside_bank", "{}"),
                ("undeclared argument name", "undeclared_argument", "{}"),
                ("seconds", "seconds", "{}"), ("generated tokens", "generated_tokens", "{}")]
        for title, key, fmt in rows:
            lines.append(f"| {title} | " + " | ".join(fmt.format(entry["modes"][m][key]) for m in modes) + " |")
        families = list(entry["modes"][modes[0]]["em_per_family"])
        for fam in families:
            lines.append(f"| EM {fam} | " + " | ".join(f"{entry['modes'][m]['em_per_family'][fam]:.1f}" for m in modes)
                         + " |")
        lines += ["", "Failure kinds (requests):", "", "| kind | " + " | ".join(modes) + " |",
                  "|---|" + "---:|" * len(modes)]
        for k in FAILURE_KINDS:
            lines.append(f"| {FAILURE_TITLES[k]} | " + " | ".join(str(entry["modes"][m]["failure_kinds"][k])
                                                               for m in modes) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """EM per family and set, one bar per decoding mode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(result["sets"])
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 3.6), squeeze=False)
    for ax, set_name in zip(axes[0], sets):
        entry = result["sets"][set_name]
        modes = list(entry["modes"])
        fams = list(entry["modes"][modes[0]]["em_per_family"])
        width = 0.8 / len(modes)
        for j, m in enumerate(modes):
            ax.bar([i + j * width for i in range(len(fams))], [entry["modes"][m]["em_per_family"][f] for f in fams],
                   width, label=f"{m} ({entry['modes'][m]['em']:.1f})")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(fams))], [f.split("_")[0] for f in fams])
        ax.set_ylim(0, 100)
        ax.set_title(f"{set_name} (n={entry['n']})")
        ax.set_ylabel("graph EM")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
