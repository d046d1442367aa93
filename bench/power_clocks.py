"""SM clock and power draw while one GEMM runs back to back: lfce's forward (lse_forward and its
lse_combine) and cuBLAS's logits GEMM x·Wᵀ of the same shape, bf16, N = 8192, at gemma2-2b and
llama3-8b. Shows which clock the card's power cap settles to under each (gemm_profile.WARM_SECONDS).

    python3 -m bench.power_clocks [--seconds 4] [--json PATH]

Each case runs for --seconds after a 2 s pause, while `nvidia-smi -lms 50` samples the SM clock,
the power draw and the active clock-event reasons (0x4: software power cap); the first 200 ms of
samples are dropped. Prints a line a case; --json PATH also writes them with meta.metadata().
"""

import argparse
import subprocess
import sys
import time

MODELS = ("gemma2-2b", "llama3-8b")  # (hidden, vocab) from lfce.presets
QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def sample(fn, seconds):
    """Run ``fn`` back to back for ``seconds``; its ms per call and the nvidia-smi samples meanwhile."""
    import torch

    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 0
    began = time.time()
    start.record()
    while time.time() - began < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    rows = [line.split(", ") for line in smi.communicate()[0].strip().splitlines()[4:]]
    clocks = [c for c in (_number(r[0]) for r in rows) if c is not None]
    power = [p for p in (_number(r[1]) for r in rows if len(r) > 1) if p is not None]
    return {"ms_per_call": start.elapsed_time(end) / calls, "calls": calls, "samples": len(rows),
            "sm_clock_mhz_mean": sum(clocks) / max(len(clocks), 1), "sm_clock_mhz_min": min(clocks, default=0.0),
            "power_w_mean": sum(power) / max(len(power), 1), "power_w_max": max(power, default=0.0),
            "clock_event_reasons": sorted({r[3] for r in rows if len(r) > 3})}


def measure_shape(hidden, vocab, seconds, tokens=8192):
    """{case: sample()} for lfce's forward and the cuBLAS logits GEMM at one shape (the benchmark
    harness's inputs, bench.impls.make_inputs)."""
    import torch

    import lfce
    from bench.impls import make_inputs

    x, w, y = (t.detach() for t in make_inputs(tokens, hidden, vocab, torch.bfloat16))
    logits = torch.empty(tokens, vocab, device="cuda", dtype=torch.bfloat16)
    cases = (("lfce_forward", lambda: lfce.linear_cross_entropy(x, w, y)),
             ("cublas_logits", lambda: torch.matmul(x, w.t(), out=logits)))
    rows = {}
    with torch.no_grad():
        for name, fn in cases:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            time.sleep(2.0)
            rows[name] = sample(fn, seconds)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the samples as JSON to PATH")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of back-to-back calls per case")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    from bench.meta import metadata, save_json
    from lfce.presets import table

    results = {}
    for model in MODELS:
        hidden, vocab = table()[model]
        for name, row in measure_shape(hidden, vocab, args.seconds).items():
            results[f"{model}/{name}"] = row
            print(f"{model:10} {name:14} {row['ms_per_call']:7.2f} ms  {row['sm_clock_mhz_mean']:6.0f} MHz "
                  f"(min {row['sm_clock_mhz_min']:.0f})  {row['power_w_mean']:5.0f} W  {row['clock_event_reasons']}",
                  flush=True)
    if args.json:
        result = metadata(" ".join(["python3 -m bench.power_clocks"] + (argv if argv is not None else sys.argv[1:])))
        result["results"] = results
        print("wrote", save_json(result, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
