# SM clock and power while one kernel runs back to back for ~4 s: lfce's forward (lse_forward +
# lse_combine) and cuBLAS's logits GEMM, at gemma2-2b and llama3-8b (N = 8192, bf16).
import json, subprocess, sys, time, torch
sys.path.insert(0, 'python')
import lfce
out = sys.argv[1]
res = {}
for name, h, v in (("gemma2-2b", 2304, 256000), ("llama3-8b", 4096, 128256)):
    n = 8192
    x = torch.randn(n, h, device='cuda', dtype=torch.bfloat16)
    w = (torch.randn(v, h, device='cuda') / h ** 0.5).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device='cuda')
    z = torch.empty(n, v, device='cuda', dtype=torch.bfloat16)
    for impl, fn in (("lfce_forward", lambda: lfce.linear_cross_entropy(x, w, y)),
                     ("cublas_logits", lambda: torch.matmul(x, w.t(), out=z))):
        with torch.no_grad():
            for _ in range(3): fn()
            torch.cuda.synchronize()
            time.sleep(2.0)  # cool down between
            smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active",
                                    "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
            t0 = time.time(); k = 0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            while time.time() - t0 < 4.0:
                for _ in range(20): fn()
                k += 20
                torch.cuda.synchronize()
            end.record(); torch.cuda.synchronize()
            smi.terminate(); lines = smi.communicate()[0].strip().splitlines()
        samples = [l.split(", ") for l in lines[4:]]  # skip the first 200 ms
        clocks = [float(s[0]) for s in samples if s[0].strip().replace('.', '').isdigit()]
        power = [float(s[1]) for s in samples if s[1].strip().replace('.', '').isdigit()]
        reasons = sorted({s[3] for s in samples if len(s) > 3})
        r = {"ms_per_call": start.elapsed_time(end) / k, "calls": k,
             "sm_clock_mhz_mean": sum(clocks) / max(len(clocks), 1), "sm_clock_mhz_min": min(clocks, default=0),
             "power_w_mean": sum(power) / max(len(power), 1), "power_w_max": max(power, default=0), "reasons": reasons}
        res[f"{name}/{impl}"] = r
        print(name, impl, json.dumps(r), flush=True)
json.dump(res, open(out, 'w'), indent=1)
