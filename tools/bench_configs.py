#!/usr/bin/env python3
"""Every shipped config, as shipped, on this machine: `strata plan CONFIG` then `strata bench CONFIG --iters N`.

Prints one table: whether it fit or was refused (and whether the refusal came before training, as the plan's
message), the measured s/step and TFLOP/s, the GPU peak (allocated) and fragmentation, the host peak (the bench
process's largest resident set) and the least MemAvailable seen while it ran, the plan's predicted step time and
measured / predicted. Exits 1 when any config died outside a clean refusal (a crash, a raw out-of-memory, a
timeout).

Usage: tools/bench_configs.py [--strata build/strata] [--iters 2] [--timeout 300] [--markdown FILE] [CONFIG...]
(no CONFIG: every configs/*.yaml and configs/zoo/*.yaml).
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
import time


def mem_available_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return float("nan")


def seconds(text):
    """'13.86 s', '694.2 ms', '30 us' -> seconds."""
    m = re.match(r"\s*([\d.]+)\s*(s|ms|us)\b", text)
    if not m:
        return None
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]


def run_plan(strata, config):
    p = subprocess.run([strata, "plan", config], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    plan = {"fits": p.returncode == 0, "step": None, "recompute": "", "text": out}
    for line in out.splitlines():
        if line.startswith("  step "):
            plan["step"] = seconds(line[len("  step "):])
        m = re.match(r"run .* recompute (\w+)", line)
        if m:
            plan["recompute"] = m.group(1)
    return plan


def run_bench(strata, config, iters, timeout, log):
    least = [mem_available_gib()]
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            least[0] = min(least[0], mem_available_gib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.time()
    with tempfile.TemporaryFile("w+") as capture:
        proc = subprocess.Popen([strata, "bench", config, "--iters", str(iters)], stdout=capture,
                                stderr=subprocess.STDOUT, text=True)
        # Reaped here, not by subprocess, for the child's own peak resident set (ru_maxrss, KiB).
        timed_out, status, usage = False, None, None
        while status is None:
            pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                status, usage = st, ru
            elif time.time() - start > timeout and not timed_out:
                proc.kill()
                timed_out = True
            else:
                time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        capture.seek(0)
        out = capture.read()
    rss_gib = usage.ru_maxrss / (1 << 20)
    done.set()
    sampler.join()
    wall = time.time() - start
    log.write(f"===== {config} (rc {proc.returncode}, {wall:.0f} s)\n{out}\n")
    log.flush()
    r = {"rc": proc.returncode, "timed_out": timed_out, "wall": wall, "least_available": least[0],
         "rss": rss_gib, "out": out}
    # The bench's own line: the measured iterations (the log's earlier lines include the warm-up).
    m = re.search(r"^bench .*\| ([\d.]+) ms/iter \| (\d+) tokens/s \| ([\d.]+) TFLOP/s", out, re.M)
    if m:
        r["step"] = float(m.group(1)) / 1e3
        r["tflops"] = float(m.group(3))
    bench_line = next((l for l in out.splitlines() if l.startswith("bench ")), "")
    for key in ("gpu_peak", "frag", "host"):
        m = re.search(r"\| " + key + r" ([\d.]+) GiB", bench_line)
        if m:
            r[key] = float(m.group(1))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*")
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--log", default="bench_configs.log", help="every bench's whole output")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    configs = args.configs or sorted(glob.glob("configs/*.yaml")) + sorted(glob.glob("configs/zoo/*.yaml"))

    rows, failures = [], []
    with open(args.log, "w") as log:
        for config in configs:
            data = re.search(r"^\s*path:\s*(\S+)", open(config).read(), re.M)
            data_path = data and os.path.normpath(os.path.join(os.path.dirname(config), data.group(1)))
            if data_path and not os.path.exists(data_path):
                print(f"note: {config}'s data file {data_path} is absent; bench trains on random tokens, "
                      f"`strata train` needs it (`strata tokenize` makes it)", flush=True)
            plan = run_plan(args.strata, config)
            r = run_bench(args.strata, config, args.iters, args.timeout, log)
            refused = r["rc"] != 0 and "does not fit" in r["out"] and "What would fit" in r["out"]
            if r["rc"] == 0 and "step" in r:
                status = "fits"
            elif refused and not plan["fits"]:
                status = "refused (as planned)"
            elif refused:
                status = "refused"
            else:
                status = "TIMEOUT" if r["timed_out"] else f"DIED (rc {r['rc']})"
                tail = [l for l in r["out"].splitlines() if l.strip()][-3:]
                failures.append(f"{config}: {status}: " + " | ".join(tail))
            predicted = plan["step"]
            ratio = r["step"] / predicted if predicted and "step" in r else None
            rows.append([
                config, status, plan["recompute"],
                f"{r['step']:.3f}" if "step" in r else "-",
                f"{r['tflops']:.1f}" if "tflops" in r else "-",
                f"{r['gpu_peak']:.1f}" if "gpu_peak" in r else "-",
                f"{r['frag']:.2f}" if "frag" in r else "-",
                f"{r['rss']:.1f}",
                f"{r['least_available']:.1f}",
                f"{predicted:.3f}" if predicted else "-",
                f"{ratio:.2f}" if ratio else "-",
            ])
            print(" | ".join(rows[-1]), flush=True)

    head = ["config", "result", "recompute", "s/step", "TFLOP/s", "GPU peak GiB", "frag GiB", "host peak GiB",
            "least MemAvailable GiB", "plan s/step", "measured/plan"]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(table))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(table) + "\n")
    for f in failures:
        print("FAILED: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
