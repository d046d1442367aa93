"""Session 14: write tuning files that make CONFIG (Candidate text, e.g. "64x192x64/wg2/s5/pp") the
winner for one kernel kind of a preset's problem on the H200 (bf16, mean, i64, no bias), in both modes.
Usage: python3 force_tile.py CACHE_DIR KIND V H N CONFIG"""
import json, os, sys

cache, kind, v, h, n, config = sys.argv[1:]
for mode in ("recompute", "eager"):
    key = {"kind": kind, "vocab": int(v), "hidden": int(h), "dtype": "bf16", "mode": mode, "bias": False,
           "reduction": "mean", "targets": "i64", "arch": "sm_90a", "smem_per_block": 232448, "sm_count": 132,
           "n_bucket": 1 << (int(n) - 1).bit_length()}
    text = f"{kind}-sm_90a-smem232448-sms132-bf16-V{v}-H{h}-N{key['n_bucket']}-{mode}-mean-i64-nobias"
    entry = {"format": 2, "key": key, "tokens": int(n), "device": "NVIDIA H200", "default": config,
             "measured_with": {}, "candidates": [{"config": config, "ms": 1.0}]}
    os.makedirs(os.path.join(cache, "tuning"), exist_ok=True)
    with open(os.path.join(cache, "tuning", text + ".json"), "w") as f:
        json.dump(entry, f)
print("forced", config, "for", kind, v, h, n)
