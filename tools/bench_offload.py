#!/usr/bin/env python3
"""Optimizer offload on one GPU: Strata (`build/strata bench`) next to DeepSpeed ZeRO-3 with its optimizer
offloaded to the CPU (DeepSpeedCPUAdam), full and Twin-Flow partial (`offload_optimizer.ratio`), same
nanoGPT-style GPT shapes (tools/bench_gpt.py), seq 512, bf16, AdamW, one run. Prints a Markdown table, one row
as soon as each run is measured, then the Strata/DeepSpeed step-time ratio per size.

Usage: python3 tools/bench_offload.py [--sizes 6.7b,13b] [--iters 3] [--ratio 1.0,0.4] [--gpu-budget match]
           [--skip-strata] [--skip-deepspeed] [--timeout 240] [--deepspeed-dir .device/deepspeed] [--dry-run]

Strata rows: `strata bench CONFIG --iters N` (N warm-up, then N measured iterations) with
`zero_optimization.offload_optimizer.device=cpu` (all optimizer state on the host), and a `store.gpu_budget_gb`
row (no offload flag: the store keeps the parameters and, in chunk order, optimizer state on the GPU while the
budget lasts, the rest on the host, as Twin-Flow does; `--gpu-budget match` gives the GPU the same share of
optimizer state as the smallest Twin-Flow ratio in --ratio, capped at --gpu-cap GiB). The host peak is the
process's peak RSS (wait4); the state columns are the store's bytes per tier from the bench line.
DeepSpeed rows: one process (RANK=0 WORLD_SIZE=1, no launcher) running `tools/bench_offload.py --worker`,
zero.Init, --warmup untimed steps, then --iters timed steps; GPU peak is torch's max_memory_allocated, host peak
the worker's peak RSS. TFLOP/s count (6·N + 12·L·d·s) per token, as bench_gpt.py and Strata do.
A run that cannot fit is a "does not fit" row (GPU OOM, a host OOM kill, or Strata refusing the placement); one
that cannot fit for certain (the optimizer state alone over the host's memory) is not started. --timeout bounds
each run, so one stuck run cannot eat the device call. When `import deepspeed` fails, DeepSpeed is installed
from --deepspeed-dir (../shared/peers/deepspeed/README.md), and DeepSpeedCPUAdam is built once before the
runs (about a minute the first time on a machine; not counted in any run's timeout).
Sizes: 6.7b and 13b are configs/gpt3-6.7b.yaml and configs/gpt3-13b.yaml; 10b is gpt3-13b.yaml with 32 layers
(10.3B, the largest GPT DeepSpeed fits on the one-H200 box per the peers README).
PyTorch and DeepSpeed are the peer only; this parent process imports neither (it stays off the GPU).
"""
import argparse
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {  # name: (layers, hidden, heads, micro batch, config, extra Strata --set overrides)
    "6.7b": (32, 4096, 32, 8, "configs/gpt3-6.7b.yaml", []),
    "10b": (32, 5120, 40, 4, "configs/gpt3-13b.yaml", ["model.num_layers=32"]),
    "13b": (40, 5120, 40, 4, "configs/gpt3-13b.yaml", []),
}
SEQ, VOCAB = 512, 50304  # as in bench_gpt.py (the worker checks); not imported here, which would import torch
GIB = 2**30
OPT_BYTES = 12  # AdamW's fp32 master, m and v per parameter: what either side puts on the host or GPU
PARAM_BYTES = 2  # bf16 parameters


def num_params(layers, d):
    """bench_gpt.GPT's parameter count (head tied to wte; LayerNorms and Linears with biases)."""
    return VOCAB * d + SEQ * d + layers * (12 * d * d + 13 * d) + 2 * d


def flops_per_token(n, layers, d):
    return 6 * n + 12 * layers * d * SEQ  # bench_gpt.flops_per_token


def meminfo_gib():
    """MemTotal and MemAvailable in GiB (None where /proc/meminfo is unreadable)."""
    out = {}
    try:
        for line in open("/proc/meminfo"):
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(value.split()[0]) * 1024 / GIB
    except OSError:
        pass
    return out.get("MemTotal"), out.get("MemAvailable")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def oom_first():
    """In the child before exec: make it (and what it starts) the host OOM killer's first choice, so that a run
    that overfills the host dies alone and is reported, not this process or anything else on the machine."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def run_limited(cmd, timeout, env=None):
    """Runs cmd in its own process group with stdout+stderr to a file; kills the group after `timeout` s.
    Returns rc (negative: killed by that signal), the output, the child's peak RSS in GiB (wait4), whether it
    timed out, and the wall time."""
    with tempfile.TemporaryFile(mode="w+") as log:
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                             preexec_fn=oom_first)
        expired = threading.Event()

        def kill():
            expired.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        except KeyboardInterrupt:
            kill()
            raise
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        if expired.is_set():
            kill()  # anything left in the group (compiler jobs)
        log.seek(0)
        out = log.read()
    return dict(rc=p.returncode, out=out, rss=usage.ru_maxrss * 1024 / GIB, timed_out=expired.is_set(),
                wall=time.time() - t0)


def tail(text, n=12):
    return "\n".join("    " + l for l in text.splitlines()[-n:])


def failure(run, what):
    """A row's note for a run that did not produce a result."""
    out = run["out"]
    low = out.lower()
    if run["timed_out"]:
        return f"timed out after {run['wall']:.0f} s"
    if run["rc"] == -signal.SIGKILL:
        return "does not fit: killed by SIGKILL (host OOM killer)"
    if "out of memory" in low or "outofmemoryerror" in low:
        line = next((l for l in reversed(out.splitlines()) if "out of memory" in l.lower()), "")
        return "does not fit: out of memory" + (f" ({line.strip()[:200]})" if line else "")
    if "the model state needs" in low or "the parameters alone need" in low:
        line = next(l for l in out.splitlines() if "the model state needs" in l or "the parameters alone need" in l)
        return "does not fit: " + line.strip()[:300]
    print(f"{what} failed (rc {run['rc']}):\n{tail(out, 30)}", flush=True)
    return f"failed (rc {run['rc']})"


# --- Strata ---------------------------------------------------------------------------------------------------

BENCH_RE = re.compile(r"^bench (\S+): (\d+) measured iterations after (\d+) warm-up \| ([\d.]+) ms/iter \| "
                      r"([\d.]+) tokens/s \| ([\d.]+) TFLOP/s \| MFU ([\d.]+)%(.*)$")


def parse_bench_line(text):
    """The last `bench ...` line of `strata bench`'s output as a dict: ms, tok, tflops, mfu, and every
    `| NAME X GiB` field (gpu, gpu_peak, host, model_state, state_device, state_host, state_nvme); None if absent."""
    for line in reversed(text.splitlines()):
        m = BENCH_RE.match(line.strip())
        if m:
            r = dict(config=m.group(1), iters=int(m.group(2)), warmup=int(m.group(3)), ms=float(m.group(4)),
                     tok=float(m.group(5)), tflops=float(m.group(6)), mfu=float(m.group(7)))
            for key, gib in re.findall(r"\|\s*(\w+) ([\d.]+) GiB", m.group(8)):
                r[key] = float(gib)
            return r
    return None


def strata_cmd(args, size, budget):
    """`strata bench` for one size: budget None = all optimizer state on the host (offload_optimizer cpu), else
    store.gpu_budget_gb=budget (parameters + optimizer state on the GPU up to it, the rest on the host)."""
    _, _, _, batch, cfg, extra = SIZES[size]
    sets = extra + [f"train.micro_batch_size={batch}", f"model.seq_length={SEQ}", f"train.global_batch_size={batch}",
                    "train.device=cuda"]
    if budget is None:
        sets.append("zero_optimization.offload_optimizer.device=cpu")
    else:
        sets.append(f"store.gpu_budget_gb={budget:g}")
    if args.nvme_path:
        sets.append(f"zero_optimization.nvme_path={args.nvme_path}")
    cmd = [args.binary, "bench", cfg, "--iters", str(args.iters)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_strata(args, size, budget):
    run = run_limited(strata_cmd(args, size, budget), args.timeout)
    r = parse_bench_line(run["out"]) if run["rc"] == 0 else None
    if r is None:
        return dict(error=failure(run, f"strata ({size})") if run["rc"] != 0 or run["timed_out"]
                    else "no bench line in the output", wall=run["wall"])
    return dict(s=r["ms"] / 1e3, tflops=r["tflops"], gpu_peak=r.get("gpu_peak"), rss=run["rss"],
                state=(r.get("state_device"), r.get("state_host"), r.get("state_nvme")), wall=run["wall"])


# --- DeepSpeed ------------------------------------------------------------------------------------------------

def ds_config(batch, ratio):
    offload = {"device": "cpu", "pin_memory": True}
    if ratio < 1.0:
        offload["ratio"] = ratio  # Twin-Flow: this share of the optimizer's sub-groups on the CPU, the rest on the GPU
    return {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,  # as Strata's configs (optimizer.clip_grad: 1.0)
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": True},
        # With offload_optimizer, "AdamW" is DeepSpeedCPUAdam (adamw_mode) for the CPU part; the GPU part of a
        # Twin-Flow run steps with torch.optim.AdamW (stage3.py's backup optimizer).
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1.2e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "offload_optimizer": offload},
    }


def worker(size, batch, ratio, warmup, iters):
    """One single-process DeepSpeed run; prints one `RESULT {json}` line and exits without teardown."""
    import resource

    import torch

    sys.path.insert(0, HERE)
    import bench_gpt
    from bench_gpt import GPT

    assert (bench_gpt.SEQ, bench_gpt.VOCAB) == (SEQ, VOCAB), "bench_gpt.py's SEQ/VOCAB changed"
    layers, d, h, _, _, _ = SIZES[size]
    result = {}
    try:
        import deepspeed

        cfg = ds_config(batch, ratio)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        deepspeed.init_distributed(dist_backend="nccl")
        torch.manual_seed(0)
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = GPT(layers, d, h)
        # The LM head reads wte.weight outside wte's forward (the tie): gather it for GPT.forward too (ZeRO-3 also
        # detects this itself; registering is explicit and harmless).
        deepspeed.zero.register_external_parameter(model, model.wte.weight)
        n = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        x = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")

        def step():
            loss = engine(x, x)
            engine.backward(loss)
            engine.step()
            return loss

        t_init = time.time()
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        times, losses = [], []
        for _ in range(iters):
            t0 = time.time()
            loss = step()
            torch.cuda.synchronize()
            times.append(time.time() - t0)
            losses.append(loss.item())
        s = sum(times) / len(times)
        result = dict(s=s, s_min=min(times), tflops=batch * SEQ / s * flops_per_token(n, layers, d) / 1e12,
                      gpu_peak=torch.cuda.max_memory_allocated() / GIB,
                      gpu_reserved=torch.cuda.max_memory_reserved() / GIB, params=n, losses=losses,
                      warmup_s=time.time() - t_init - sum(times))
    except BaseException as e:  # noqa: B036 (report any failure as a row, OOM included)
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in msg.lower()
        result = dict(error=("does not fit: GPU out of memory: " if oom else "failed: ") + msg)
        import traceback
        traceback.print_exc()
    result["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    print("RESULT " + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0 if "error" not in result else 3)  # no teardown: freeing ~100 GiB of pinned memory takes a while


def ds_env():
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), NCCL_NVLS_ENABLE="0")
    # DeepSpeed builds its ops with ninja from the Python environment's bin (the ninja wheel), which need not be
    # on PATH when python3 is a virtual environment called by its path.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def ensure_deepspeed(args):
    """Installs DeepSpeed from --deepspeed-dir when it does not import, then builds DeepSpeedCPUAdam once (cached
    under ~/.cache/torch_extensions). Returns None on success, else why DeepSpeed cannot run."""
    py = sys.executable
    code = "import deepspeed; print('DEEPSPEED', deepspeed.__version__)"
    probe = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        folder = args.deepspeed_dir
        wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
        sdist = sorted(glob.glob(os.path.join(folder, "deepspeed-*.tar.gz")))
        if not wheels or not sdist:
            return f"deepspeed does not import and {folder} has no wheels or deepspeed sdist to install"
        print(f"installing DeepSpeed from {folder} ...", flush=True)
        t0 = time.time()
        for cmd, extra_env in (
                ([py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", "--find-links", folder]
                 + wheels, {}),
                ([py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", "--no-deps", sdist[-1]],
                 {"DS_BUILD_OPS": "0"})):
            run = subprocess.run(cmd, env=dict(os.environ, **extra_env), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            if run.returncode != 0:
                return f"pip install failed (rc {run.returncode}):\n{tail(run.stdout, 20)}"
        probe = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if probe.returncode != 0:
            return f"deepspeed still does not import:\n{tail(probe.stdout, 20)}"
        print(f"installed DeepSpeed from {folder} in {time.time() - t0:.0f} s", flush=True)
    version = next((l.split()[1] for l in probe.stdout.splitlines() if l.startswith("DEEPSPEED ")), "?")
    t0 = time.time()
    build = run_limited([py, "-c", "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"],
                        args.build_timeout, env=ds_env())
    if build["rc"] != 0:
        return (f"building DeepSpeedCPUAdam failed (rc {build['rc']}{', timed out' if build['timed_out'] else ''}):"
                f"\n{tail(build['out'], 20)}")
    print(f"DeepSpeed {version}; DeepSpeedCPUAdam ready in {time.time() - t0:.0f} s", flush=True)
    return None


def ds_cmd(args, size, ratio):
    batch = SIZES[size][3]
    return [sys.executable, os.path.abspath(__file__), "--worker", "--size", size, "--batch", str(batch),
            "--ratio", f"{ratio:g}", "--warmup", str(args.warmup), "--iters", str(args.iters)]


def run_deepspeed(args, size, ratio):
    run = run_limited(ds_cmd(args, size, ratio), args.timeout, env=ds_env())
    res = None
    for line in run["out"].splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    if res is None:
        return dict(error=failure(run, f"DeepSpeed ({size}, ratio {ratio:g})"), wall=run["wall"])
    res["wall"] = run["wall"]
    if "error" in res and not res["error"].startswith("does not fit"):
        print(f"DeepSpeed ({size}, ratio {ratio:g}) {res['error']}:\n{tail(run['out'], 30)}", flush=True)
    return res


# --- the table ------------------------------------------------------------------------------------------------

def fmt(x, spec=".1f"):
    return "–" if x is None else format(x, spec)


def row(size, batch, name, r):
    if r is None:
        return
    if "error" in r:
        print(f"| {size} | {batch} | {name} | {r['error']} | | | | | {fmt(r.get('wall'), '.0f')} |", flush=True)
        return
    state = " / ".join(fmt(v, ".1f") for v in r["state"]) if r.get("state") else "–"
    print(f"| {size} | {batch} | {name} | {r['s']:.2f} | {r['tflops']:.1f} | {fmt(r.get('gpu_peak'))} "
          f"| {fmt(r.get('rss'))} | {state} | {r['wall']:.0f} |", flush=True)


def parse_budgets(text, sizes):
    """--gpu-budget: 'none', 'match', a number of GiB, or SIZE=GIB,... (a size not named gets 'match')."""
    if text in ("none", "match"):
        return {s: text for s in sizes}
    if "=" not in text:
        return {s: float(text) for s in sizes}
    out = {s: "match" for s in sizes}
    for item in text.split(","):
        key, value = item.split("=", 1)
        if key not in SIZES:
            raise SystemExit(f"--gpu-budget: unknown size {key!r} (sizes: {', '.join(SIZES)})")
        out[key] = value if value in ("none", "match") else float(value)
    return out


def match_budget(size, ratio, cap):
    """GiB of GPU budget for Strata's store so that the GPU holds the parameters and the share (1 - ratio) of the
    optimizer state that Twin-Flow at `ratio` keeps there; at most `cap`."""
    layers, d = SIZES[size][:2]
    n = num_params(layers, d)
    return round(min(cap, (PARAM_BYTES * n + (1 - ratio) * OPT_BYTES * n) / GIB), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--sizes", default="6.7b", help=f"comma list of {', '.join(SIZES)}")
    ap.add_argument("--iters", type=int, default=3, help="measured steps (Strata also warms up as many)")
    ap.add_argument("--warmup", type=int, default=2, help="DeepSpeed's untimed steps before the measured ones")
    ap.add_argument("--ratio", default="1.0,0.4",
                    help="DeepSpeed offload ratios to run: 1.0 = full offload, <1 = Twin-Flow (share on the CPU)")
    ap.add_argument("--gpu-budget", default="match",
                    help="Strata's store.gpu_budget_gb row: 'match' (Twin-Flow's GPU share at the smallest ratio "
                         "< 1 in --ratio, else 0.4), a number of GiB, SIZE=GIB,..., or 'none' (no such row)")
    ap.add_argument("--gpu-cap", type=float, default=90.0,
                    help="most GiB 'match' gives the store on the GPU (activations need the rest of the 139 GiB)")
    ap.add_argument("--nvme-path", default="",
                    help="zero_optimization.nvme_path for Strata: optimizer state past the host budget goes to the "
                         "SSD (about a minute a step); without it a size whose optimizer state is over the host "
                         "is a 'does not fit' row for Strata's full-offload run")
    ap.add_argument("--skip-strata", action="store_true")
    ap.add_argument("--skip-deepspeed", action="store_true")
    ap.add_argument("--force", action="store_true", help="run even the runs predicted not to fit the host")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run before it is killed")
    ap.add_argument("--build-timeout", type=float, default=300, help="seconds for building DeepSpeedCPUAdam")
    ap.add_argument("--deepspeed-dir", default=".device/deepspeed",
                    help="DeepSpeed sdist and wheels to install from when `import deepspeed` fails")
    ap.add_argument("--dry-run", action="store_true", help="print the runs (commands, configs) and run nothing")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="6.7b", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        ratio = float(args.ratio)
        return worker(args.size, args.batch or SIZES[args.size][3], ratio, args.warmup, args.iters)

    sizes = args.sizes.split(",")
    for s in sizes:
        if s not in SIZES:
            ap.error(f"unknown size {s!r} (sizes: {', '.join(SIZES)})")
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    ratios = [float(r) for r in args.ratio.split(",") if r]
    for r in ratios:
        if not 0.0 <= r <= 1.0:
            ap.error(f"--ratio {r:g}: a ratio is in [0, 1]")
    twin = min([r for r in ratios if r < 1.0], default=0.4)
    budgets = parse_budgets(args.gpu_budget, sizes)
    for s in sizes:
        if budgets[s] == "match":
            budgets[s] = match_budget(s, twin, args.gpu_cap)

    mem_total, mem_avail = meminfo_gib()
    run_strata_rows = not args.skip_strata
    if run_strata_rows and not os.path.exists(args.binary) and not args.dry_run:
        print(f"{args.binary} does not exist (build it first); the Strata rows are left out", flush=True)
        run_strata_rows = False
    ds_why = None
    if not args.skip_deepspeed and not args.dry_run:
        ds_why = ensure_deepspeed(args)
        if ds_why:
            print(f"DeepSpeed rows left out: {ds_why}", flush=True)

    host = f"host {mem_total:.0f} GiB ({mem_avail:.0f} available)" if mem_total else "host memory unknown"
    if args.dry_run:
        print(f"dry run ({host}); the runs, in order:")
    else:
        print(f"\nOptimizer offload, one GPU: seq {SEQ}, bf16, AdamW; {host}; {args.iters} measured steps "
              f"after {args.iters} (Strata) or {args.warmup} (DeepSpeed) warm-up steps; TFLOP/s count "
              "(6·N + 12·L·d·s) per token")
        print("| model | batch | run | s/step | TFLOP/s | GPU peak GiB | host peak RSS GiB "
              "| state GPU / host / SSD GiB | wall s |")
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
    summary = []
    for size in sizes:
        layers, d, _, batch, cfg, _ = SIZES[size]
        n = num_params(layers, d)
        opt_gib = OPT_BYTES * n / GIB
        label = f"{size} ({n / 1e9:.2f}B)"
        strata_rows, ds_rows = {}, {}
        if run_strata_rows:
            plans = [("offload", None)]
            if budgets[size] != "none":
                plans.append(("budget", float(budgets[size])))
            for kind, budget in plans:
                name = ("Strata, offload_optimizer cpu" if budget is None
                        else f"Strata, store.gpu_budget_gb={budget:g}")
                host_part = opt_gib if budget is None else max(0.0, opt_gib - (budget - PARAM_BYTES * n / GIB))
                r = None
                if (not args.nvme_path and not args.force and mem_avail is not None
                        and host_part > 0.9 * mem_avail):
                    r = dict(error=f"does not fit: {host_part:.1f} GiB of optimizer state on the host, over the "
                                   f"store's host budget (90% of {mem_avail:.0f} GiB available) and no --nvme-path; "
                                   "not run")
                if args.dry_run:
                    print(f"  {name}: " + (r["error"] if r else " ".join(strata_cmd(args, size, budget))), flush=True)
                    continue
                if r is None:
                    r = run_strata(args, size, budget)
                strata_rows[kind] = r
                row(label, batch, name, r)
        if not args.skip_deepspeed and not ds_why:
            for ratio in ratios:
                name = ("DeepSpeed ZeRO-3, offload_optimizer cpu" if ratio >= 1.0
                        else f"DeepSpeed ZeRO-3, Twin-Flow ratio {ratio:g}")
                host_need = ratio * opt_gib
                r = None
                if not args.force and mem_total is not None and host_need > mem_total:
                    r = dict(error=f"does not fit: its optimizer state on the host alone is {host_need:.1f} GiB, "
                                   f"over the host's {mem_total:.0f} GiB; not run")
                if args.dry_run:
                    print(f"  {name}: " + (r["error"] if r else " ".join(ds_cmd(args, size, ratio))
                                           + "\n    ds_config " + json.dumps(ds_config(batch, ratio))), flush=True)
                    continue
                if r is None:
                    r = run_deepspeed(args, size, ratio)
                ds_rows[ratio] = r
                row(label, batch, name, r)
        summary.append((size, strata_rows, ds_rows))

    if args.dry_run:
        return
    print()
    for size, strata_rows, ds_rows in summary:
        ok_s = {k: r for k, r in strata_rows.items() if "error" not in r}
        ok_d = {k: r for k, r in ds_rows.items() if "error" not in r}
        parts = []
        if "offload" in ok_s and 1.0 in ok_d:
            a, b = ok_s["offload"]["s"], ok_d[1.0]["s"]
            parts.append(f"full offload {a / b:.2f} ({a:.2f} / {b:.2f} s)")
        partial = [r for r in ok_d if r < 1.0]
        if "budget" in ok_s and partial:
            a, b = ok_s["budget"]["s"], ok_d[min(partial)]["s"]
            parts.append(f"GPU budget vs Twin-Flow {min(partial):g} {a / b:.2f} ({a:.2f} / {b:.2f} s)")
        if ok_s and ok_d:
            a, b = min(r["s"] for r in ok_s.values()), min(r["s"] for r in ok_d.values())
            parts.append(f"best {a / b:.2f} ({a:.2f} / {b:.2f} s)")
        elif ok_s and ds_rows:
            parts.append(f"DeepSpeed does not fit; Strata's best {min(r['s'] for r in ok_s.values()):.2f} s/step")
        print(f"{size}: step time Strata / DeepSpeed: " + ("; ".join(parts) if parts else "nothing to compare"),
              flush=True)


if __name__ == "__main__":
    main()
