"""Service load test on loopback: `skillbank serve` under 1, 4 and 16 concurrent clients, per engine, in one run.

For each engine (--engines, default llama.cpp and torch) a fresh `skillbank serve BANK --engine E` process is
started on 127.0.0.1 (learning over HTTP off, so the bank is only read) and warmed up with one request per
shard; then for each count of --clients, that many clients run a closed loop for --seconds (each sends its
next request when the previous answer arrives; requests still running at the end are cut off and not
counted), taking in turn held-out requests of every family of the built-in benchmark, so the traffic mixes
all shards. Reported per engine and client count: completed requests, throughput (requests/s and generated
tokens/s), p50/p95 latency, errors (anything but 200; 429s listed apart, as deliberate back-pressure), mean
batch size (rows decoding together when a request joins); then each engine's 16-client throughput over its
own one-client figure (the batch-1 service) and the engines' ratios, and how many answers both engines gave
alike.

    .venv/bin/python bench/serve.py [--bank runs/demo/methods/fsm/bank] [--clients 1,4,16] [--seconds 60]

With --batching-ratio it runs the earlier comparison instead: one engine (--engine) with batching and without
(--no-batching), --clients (one count) each, and the batched/unbatched throughput ratio.

With --flood it measures fair admission instead: a polite client (its own loopback address, one plan at a
time, waiting out Retry-After on a 429) first alone on an idle server, then side by side with a flooding
client (another loopback address, --flooders concurrent requests, each retried 0.1 s after a 429, Retry-After
ignored), against a queue of --flood-queue; once with fair admission and once without (--no-fair-admission,
one queue in arrival order). Reported: the polite client's plans/s and median latency idle and under the
flood, their ratio (target: the flooded rate within 2x of the idle one), its 429s, and the flooder's plans/s
and 429s/s.

    .venv/bin/python bench/serve.py --flood [--bank ...] [--seconds 60] [--flooders 32]
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


def start_server(bank: Path, port: int, args, batching: bool, extra: tuple[str, ...] = (),
                 engine: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "skillbank", "serve", str(bank), "--port", str(port), "--log-level", "warning",
           "--engine", engine or args.engine,
           "--max-new-tokens", str(args.max_new_tokens), "--max-batch", str(args.max_batch),
           "--batch-window-ms", str(args.window_ms), "--queue-size", "1024", "--timeout-s", "1800",
           # every request generated: the load test measures generation, not how many the scope check refuses
           "--no-scope", *extra]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if not batching:
        cmd.append("--no-batching")
    env = {k: v for k, v in os.environ.items() if k != "SKILLBANK_ADMIN_TOKEN"}  # read-only: no learning
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


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
            "tokens_per_s": tokens / run["wall"], "p50_s": percentile(lat, 50), "p95_s": percentile(lat, 95),
            "p99_s": percentile(lat, 99),
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
        stop_server(proc)
    # Batch statistics of the measured part only: subtract the warm-up's.
    diff = "\n".join(f"{n} {metric_sum(metrics_text, n) - metric_sum(base_metrics, n)}"
                     for n in ("skillbank_batch_size_count", "skillbank_batch_size_sum"))
    return summarise(name, run, diff)


# -- engines x concurrent clients ----------------------------------------------------------------------
def run_engine(bank: Path, args, requests: list[str], engine: str, warm: list[str]) -> list[dict]:
    """One server with ``engine``; a closed loop per client count. Returns one summary per count."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"[{engine}] starting skillbank serve on {url} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = start_server(bank, port, args, batching=True, engine=engine)
    out = []
    try:
        wait_healthy(url, proc)
        health = httpx.get(url + "/healthz").json()
        if health.get("engine") != engine:
            sys.exit(f"the server runs the {health.get('engine')} engine, not {engine}")
        for request in warm:  # every shard loaded (and, for llama.cpp, merged) before anything is measured
            httpx.post(url + "/v1/plan", json={"request": request}, timeout=600)
        print(f"[{engine}] up and warm in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        for clients in args.client_counts:
            before = httpx.get(url + "/metrics").text
            print(f"[{engine}] {clients} clients for {args.seconds:g} s ...", file=sys.stderr, flush=True)
            run = asyncio.run(load(url, requests, clients, args.seconds))
            after = httpx.get(url + "/metrics").text
            diff = "\n".join(f"{n} {metric_sum(after, n) - metric_sum(before, n)}"
                             for n in ("skillbank_batch_size_count", "skillbank_batch_size_sum"))
            summary = summarise(f"{engine} x{clients}", run, diff)
            summary.update(engine=engine, clients=clients)
            out.append(summary)
    finally:
        stop_server(proc)
    return out


def main_engines(args, requests: list[str], shards: list[str], warm: list[str]) -> None:
    t0 = time.perf_counter()
    runs = {engine: run_engine(args.bank, args, requests, engine, warm) for engine in args.engine_list}
    print(f"\nmixed traffic over {len(shards)} shards, loopback, greedy, grammar on, cap {args.max_new_tokens} tokens, "
          f"threads {args.threads or 'cores - 1'}, max batch {args.max_batch}, window {args.window_ms:g} ms, "
          f"{args.seconds:g} s per row; machine: {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'engine':<10} {'clients':>7} {'done':>5} {'cut':>4} {'req/s':>7} {'tok/s':>7} {'p50 s':>7} {'p95 s':>7} "
          f"{'errors':>6} {'429':>4} {'batch':>6} {'valid':>6}")
    for engine, rows in runs.items():
        for r in rows:
            print(f"{engine:<10} {r['clients']:>7} {r['completed']:>5} {r['cut']:>4} {r['req_per_s']:>7.3f} "
                  f"{r['tokens_per_s']:>7.1f} {r['p50_s']:>7.2f} {r['p95_s']:>7.2f} {r['errors']:>6} "
                  f"{r['rejected_429']:>4} {r['mean_batch']:>6.2f} {r['valid']:>6}")
    ratios = {}
    for engine, rows in runs.items():
        one, most = rows[0], rows[-1]
        if one["req_per_s"]:
            ratios[f"{engine}: {most['clients']} clients / {one['clients']} (throughput)"] = most["req_per_s"] / one["req_per_s"]
    if len(runs) == 2:
        (a, ra), (b, rb) = runs.items()
        for x, y in zip(ra, rb):
            if y["req_per_s"]:
                ratios[f"{a} / {b}, {x['clients']} clients (throughput)"] = x["req_per_s"] / y["req_per_s"]
            if x["p50_s"]:
                ratios[f"{b} / {a}, {x['clients']} clients (p50 latency)"] = y["p50_s"] / x["p50_s"]
        same = both = 0
        for x, y in zip(ra, rb):
            common = set(x["answers"]) & set(y["answers"])
            both += len(common)
            same += sum(x["answers"][i] == y["answers"][i] for i in common)
        ratios_text = f"identical answers ({a} vs {b}, same request index and client count): {same}/{both}"
    else:
        ratios_text = ""
    print("ratios:")
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}x")
    if ratios_text:
        print("  " + ratios_text)
    print(f"total {time.perf_counter() - t0:.0f} s")
    for rows in runs.values():
        for r in rows:
            for sample in r["error_samples"]:
                print(f"  {r['mode']} error: {sample}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "ratios": ratios,
                                         "load_average": os.getloadavg(),
                                         "runs": {e: [{k: v for k, v in r.items() if k != "answers"} for r in rows]
                                                  for e, rows in runs.items()}}, indent=1))


# -- fair admission under a flood ----------------------------------------------------------------------
POLITE, FLOODER = "127.0.0.3", "127.0.0.2"  # 127.0.0.0/8 is all loopback: two clients the server tells apart


def _client(url: str, address: str, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600), limits=limits,
                             transport=httpx.AsyncHTTPTransport(local_address=address, limits=limits))


async def polite(url: str, requests: list[str], seconds: float, stop: asyncio.Event | None = None) -> dict:
    """One plan at a time; a 429 is waited out for its Retry-After."""
    done, refused, latencies, i, timings = 0, 0, [], 0, []
    t0 = last = time.perf_counter()
    async with _client(url, POLITE, 1) as http:
        while (left := seconds - (time.perf_counter() - t0)) > 0:
            start = time.perf_counter()
            try:
                r = await asyncio.wait_for(http.post("/v1/plan", json={"request": requests[i % len(requests)]}), left)
            except asyncio.TimeoutError:
                break
            i += 1
            if r.status_code == 200:
                done += 1
                last = time.perf_counter()
                latencies.append(last - start)
                timings.append(r.json()["plans"][0]["timings"])
            elif r.status_code == 429:
                refused += 1
                await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), max(0.0, left)))
            else:
                raise RuntimeError(f"polite client got {r.status_code}: {r.text[:300]}")
    if stop is not None:
        stop.set()
    # Where the time went, as the server saw it (median ms): waiting for a row, generating, and all of it.
    server = {k: percentile([t[k] for t in timings], 50) for k in ("queue_ms", "generate_ms", "total_ms")}
    # Plans per second up to the last answer: a request cut off at the end is not half a plan.
    return {"plans": done, "per_s": done / (last - t0) if done else 0.0, "refused": refused,
            "p50_s": percentile(latencies, 50), "server_p50_ms": server}


async def flooder(url: str, requests: list[str], workers: int, stop: asyncio.Event, seconds: float) -> dict:
    """``workers`` requests in flight at all times, each retried 0.1 s after a 429 (Retry-After ignored)."""
    counts = {"plans": 0, "refused": 0}
    t0 = time.perf_counter()

    async def worker(http: httpx.AsyncClient, k: int) -> None:
        i = k
        while not stop.is_set():
            try:
                r = await http.post("/v1/plan", json={"request": requests[i % len(requests)]})
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
                continue
            i += workers
            if r.status_code == 200:
                counts["plans"] += 1
            else:
                counts["refused"] += 1
                await asyncio.sleep(0.1)

    async with _client(url, FLOODER, workers) as http:
        tasks = [asyncio.create_task(worker(http, k)) for k in range(workers)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - t0
    return {"plans_per_s": counts["plans"] / wall, "refused_per_s": counts["refused"] / wall}


async def flooded(url: str, requests: list[str], args) -> tuple[dict, dict]:
    stop = asyncio.Event()
    flood = asyncio.create_task(flooder(url, requests[::-1], args.flooders, stop, args.seconds))
    await asyncio.sleep(2)  # the flood fills the queue first
    mine = await polite(url, requests, args.seconds, stop)
    return mine, await flood


def run_flood(bank: Path, args, requests: list[str], fair: bool) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    name = "fair" if fair else "first-come"
    extra = ("--queue-size", str(args.flood_queue)) + (() if fair else ("--no-fair-admission",))
    print(f"[{name}] starting skillbank serve on {url} ...", file=sys.stderr, flush=True)
    proc = start_server(bank, port, args, batching=True, extra=extra)
    try:
        wait_healthy(url, proc)
        httpx.post(url + "/v1/plan", json={"request": requests[-1]}, timeout=600)  # warm-up, not measured
        print(f"[{name}] the polite client alone for {args.seconds:g} s ...", file=sys.stderr, flush=True)
        idle = asyncio.run(polite(url, requests, args.seconds))
        print(f"[{name}] the polite client beside a flood of {args.flooders} for {args.seconds:g} s ...",
              file=sys.stderr, flush=True)
        under, flood = asyncio.run(flooded(url, requests, args))
        text = httpx.get(url + "/metrics").text
        under["batch_limit_at_end"] = metric_sum(text, "skillbank_batch_limit")
    finally:
        stop_server(proc)
    ratio = idle["per_s"] / under["per_s"] if under["per_s"] else float("inf")
    return {"mode": name, "idle": idle, "flooded": under, "flood": flood, "slowdown": ratio}


def main_flood(args, requests: list[str], shards: list[str]) -> None:
    results = [run_flood(args.bank, args, requests, fair) for fair in (True, False)]
    print(f"\npolite client (one plan at a time, honours Retry-After) beside a flooder ({args.flooders} in flight, "
          f"retries 0.1 s after a 429), queue {args.flood_queue}, {len(shards)} shards, loopback, cap "
          f"{args.max_new_tokens} tokens, torch threads {args.threads or 'cores - 1'}, {args.seconds:g} s each")
    print(f"{'admission':<11} {'idle/s':>7} {'idle p50':>8} {'flood/s':>7} {'flood p50':>9} {'slowdown':>8} "
          f"{'429s':>5} {'flooder/s':>9} {'its 429/s':>9}")
    for r in results:
        i, u, f = r["idle"], r["flooded"], r["flood"]
        print(f"{r['mode']:<11} {i['per_s']:>7.3f} {i['p50_s']:>8.2f} {u['per_s']:>7.3f} {u['p50_s']:>9.2f} "
              f"{r['slowdown']:>7.2f}x {u['refused']:>5} {f['plans_per_s']:>9.3f} {f['refused_per_s']:>9.1f}")
    print("target: the polite client's flooded rate within 2x of its idle rate (slowdown <= 2) with fair admission")
    for r in results:
        for phase in ("idle", "flooded"):
            ms = r[phase]["server_p50_ms"]
            print(f"  {r['mode']:<11} {phase:<8} polite request, server side (median ms): queue {ms['queue_ms']:.0f}, "
                  f"generate {ms['generate_ms']:.0f}, total {ms['total_ms']:.0f}"
                  + (f"; batch limit {r[phase]['batch_limit_at_end']:g} rows" if phase == "flooded" else ""))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "flood": results},
                                        indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, default=Path("runs/demo/methods/fsm/bank"))
    ap.add_argument("--clients", default="1,4,16", help="concurrent clients: counts to sweep (--batching-ratio: one)")
    ap.add_argument("--engines", default="llama.cpp,torch", help="engines to compare (skillbank serve --engine)")
    ap.add_argument("--engine", default="auto", help="--batching-ratio and --flood: the one engine to run")
    ap.add_argument("--batching-ratio", action="store_true", help="compare batching on and off instead")
    ap.add_argument("--seconds", type=float, default=60, help="length of each measured run")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--window-ms", type=float, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=160, help="the built-in stream's longest target is 127")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of the server (default: the server's own, cores - 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--flood", action="store_true", help="measure fair admission under a flood instead")
    ap.add_argument("--flooders", type=int, default=32, help="--flood: the flooder's requests in flight")
    ap.add_argument("--flood-queue", type=int, default=32, help="--flood: the server's --queue-size")
    args = ap.parse_args()
    args.client_counts = [int(c) for c in str(args.clients).split(",")]
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
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
    if args.flood:
        main_flood(args, requests, shards)
        return
    if not args.batching_ratio:
        main_engines(args, requests, shards, warm=[per_family[i][-1] for i in range(len(shards))])
        return
    if len(args.client_counts) != 1:
        sys.exit("--batching-ratio takes one --clients count")
    args.clients = args.client_counts[0]

    t0 = time.perf_counter()
    batched = run_mode(args.bank, args, requests, batching=True)
    unbatched = run_mode(args.bank, args, requests, batching=False)
    same = sum(batched["answers"].get(i) == a for i, a in unbatched["answers"].items())
    both = len(set(batched["answers"]) & set(unbatched["answers"]))

    print(f"\n{args.clients} concurrent clients, {len(shards)} shards, loopback, greedy, cap {args.max_new_tokens} "
          f"tokens, engine {args.engine}, threads {args.threads or 'cores - 1'}, max batch {args.max_batch}, window {args.window_ms:g} ms")
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
