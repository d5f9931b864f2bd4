"""Service load test on loopback: the same requests against `skillbank serve` with batching and without, in one run.

For each mode a fresh `skillbank serve BANK` process is started on 127.0.0.1 (learning over HTTP off, so the
bank is only read) and warmed up with one request; then --clients concurrent clients run a closed loop for
--seconds (each sends its next request when the previous answer arrives; requests still running at the
end are cut off and not counted), taking in turn held-out requests of every family of the built-in
benchmark, so they spread over all shards. Reported per mode: completed requests, throughput (requests/s
and generated tokens/s), p50/p99 latency, errors (anything but 200; 429s would be listed apart, as
deliberate back-pressure), mean batch size (rows decoding together when a request joins), and the Address
Memory's routing time per request and as a share of the mean request latency; then the batched/unbatched
throughput ratio and how many requests answered in both modes got identical answers.

    .venv/bin/python bench/serve.py [--bank runs/demo/methods/fsm/bank] [--clients 16] [--seconds 90]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of one Prometheus series name (all label sets)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", line)
        if m:
            total += float(m.group(1))
    return total


def start_server(bank: Path, port: int, args, batching: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "skillbank", "serve", str(bank), "--port", str(port), "--log-level", "warning",
           "--max-new-tokens", str(args.max_new_tokens), "--max-batch", str(args.max_batch),
           "--batch-window-ms", str(args.window_ms), "--queue-size", "1024", "--timeout-s", "1800",
           # every request generated: the load test measures generation, not how many the scope check refuses
           "--no-scope"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if not batching:
        cmd.append("--no-batching")
    env = {k: v for k, v in os.environ.items() if k != "SKILLBANK_ADMIN_TOKEN"}  # read-only: no learning
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with code {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"{url} did not come up in {timeout} s")


async def load(url: str, requests: list[str], clients: int, seconds: float) -> dict:
    """Closed loop for ``seconds``: each client sends its next request when the previous answer arrives.
    Requests still running at the end are cut off (the client hangs up) and not counted."""
    results: dict[int, dict] = {}
    next_index = 0
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal next_index
        while (left := seconds - (time.perf_counter() - t0)) > 0:
            i = next_index
            next_index += 1
            start = time.perf_counter()
            try:
                r = await asyncio.wait_for(http.post("/v1/plan", json={"request": requests[i % len(requests)]}), left)
                status, body = r.status_code, (r.json() if r.status_code == 200 else r.text[:200])
            except asyncio.TimeoutError:
                results[i] = {"status": "cut", "latency": None, "body": None}
                return
            except httpx.HTTPError as exc:
                status, body = 0, f"{type(exc).__name__}: {exc}"
            results[i] = {"status": status, "latency": time.perf_counter() - start, "body": body}

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600), limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return {"wall": seconds, "results": results}


def summarise(name: str, run: dict, metrics_text: str) -> dict:
    results = run["results"]
    ok = {i: r for i, r in results.items() if r["status"] == 200}
    lat = [r["latency"] for r in ok.values()]  # requests cut at the end have none
    plans = [r["body"]["plans"][0] for r in ok.values()]
    tokens = sum(p["tokens"] for p in plans)
    route_ms = statistics.mean(p["timings"]["route_ms"] for p in plans) if plans else float("nan")
    total_ms = statistics.mean(p["timings"]["total_ms"] for p in plans) if plans else float("nan")
    batches = metric_sum(metrics_text, "skillbank_batch_size_count")
    rows = metric_sum(metrics_text, "skillbank_batch_size_sum")
    return {"mode": name, "completed": len(ok), "wall_s": run["wall"], "req_per_s": len(ok) / run["wall"],
            "tokens_per_s": tokens / run["wall"], "p50_s": percentile(lat, 50), "p99_s": percentile(lat, 99),
            "errors": sum(1 for r in results.values() if r["status"] not in (200, 429, "cut")),
            "cut": sum(1 for r in results.values() if r["status"] == "cut"),
            "rejected_429": sum(1 for r in results.values() if r["status"] == 429),
            "mean_batch": rows / batches if batches else float("nan"), "route_ms": route_ms,
            "route_share": route_ms / total_ms if total_ms else float("nan"),
            "valid": sum(p["valid"] for p in plans),
            "answers": {i: (r["body"]["plans"][0]["shard"], r["body"]["plans"][0]["raw"]) for i, r in ok.items()},
            "error_samples": [r["body"] for r in results.values() if r["status"] not in (200, 429, "cut")][:3]}


def run_mode(bank: Path, args, requests: list[str], batching: bool) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    name = "batched" if batching else "unbatched"
    print(f"[{name}] starting skillbank serve on {url} ...", file=sys.stderr, flush=True)
    proc = start_server(bank, port, args, batching)
    try:
        wait_healthy(url, proc)
        httpx.post(url + "/v1/plan", json={"request": requests[-1]}, timeout=600)  # warm-up, not measured
        base_metrics = httpx.get(url + "/metrics").text
        print(f"[{name}] {args.clients} clients for {args.seconds:g} s ...", file=sys.stderr, flush=True)
        run = asyncio.run(load(url, requests, args.clients, args.seconds))
        metrics_text = httpx.get(url + "/metrics").text
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    # Batch statistics of the measured part only: subtract the warm-up's.
    diff = "\n".join(f"{n} {metric_sum(metrics_text, n) - metric_sum(base_metrics, n)}"
                     for n in ("skillbank_batch_size_count", "skillbank_batch_size_sum"))
    return summarise(name, run, diff)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, default=Path("runs/demo/methods/fsm/bank"))
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=90, help="length of each mode's run")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--window-ms", type=float, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=160, help="the built-in stream's longest target is 127")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of the server (default: the server's own, cores - 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    if not (args.bank / "bank.json").is_file():
        sys.exit(f"{args.bank} is not a bank: run `make demo` first (it writes runs/demo/methods/fsm/bank) or pass --bank")

    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.bank import read_manifest
    shards = [s.name for s in read_manifest(args.bank).shards]
    stream = build_builtin_stream(seed=0)
    if not set(shards) <= set(stream.family_keys):
        sys.exit(f"{args.bank} was not learned on the built-in families; this benchmark needs such a bank")
    # Interleave the families (from the end of each held-out list, away from the demo's evaluation cut).
    per_family = [[r.request for r in reversed(stream.test[k])] for k in shards]
    n = min(len(x) for x in per_family) * len(shards)
    requests = [per_family[i % len(shards)][i // len(shards)] for i in range(n)]  # the warm-up takes the last

    t0 = time.perf_counter()
    batched = run_mode(args.bank, args, requests, batching=True)
    unbatched = run_mode(args.bank, args, requests, batching=False)
    same = sum(batched["answers"].get(i) == a for i, a in unbatched["answers"].items())
    both = len(set(batched["answers"]) & set(unbatched["answers"]))

    print(f"\n{args.clients} concurrent clients, {len(shards)} shards, loopback, greedy, cap {args.max_new_tokens} "
          f"tokens, torch threads {args.threads or 'cores - 1'}, max batch {args.max_batch}, window {args.window_ms:g} ms")
    print(f"{'mode':<10} {'done':>5} {'cut':>4} {'req/s':>7} {'tok/s':>7} {'p50 s':>7} {'p99 s':>7} "
          f"{'errors':>6} {'429':>4} {'batch':>6} {'route ms':>9} {'route share':>11}")
    for r in (batched, unbatched):
        print(f"{r['mode']:<10} {r['completed']:>5} {r['cut']:>4} {r['req_per_s']:>7.3f} {r['tokens_per_s']:>7.1f} "
              f"{r['p50_s']:>7.2f} {r['p99_s']:>7.2f} {r['errors']:>6} {r['rejected_429']:>4} {r['mean_batch']:>6.2f} "
              f"{r['route_ms']:>9.3f} {100 * r['route_share']:>10.4f}%")
    ratio = batched["req_per_s"] / unbatched["req_per_s"] if unbatched["req_per_s"] else float("nan")
    print(f"throughput ratio batched/unbatched: {ratio:.2f}x (target >= 3x)   identical answers in both modes: "
          f"{same}/{both}   valid graphs: {batched['valid']}/{batched['completed']} batched, "
          f"{unbatched['valid']}/{unbatched['completed']} unbatched   total {time.perf_counter() - t0:.0f} s")
    for r in (batched, unbatched):
        for sample in r["error_samples"]:
            print(f"  {r['mode']} error: {sample}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "ratio": ratio,
                                         "identical": [same, both],
                                         "modes": [{k: v for k, v in r.items() if k != "answers"}
                                                   for r in (batched, unbatched)]}, indent=1))


if __name__ == "__main__":
    main()
