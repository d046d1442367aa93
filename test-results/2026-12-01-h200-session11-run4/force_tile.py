"""Write a tuning file that makes `config` (Candidate text, e.g. "64x256x64/wg2/s4/pp;chunk=16384") the
winner for one kernel kind of a preset's problem on the H200 (bf16, mean, recompute, i64, no bias).
Usage: python3 force_tile.py CACHE_DIR KIND V H N CONFIG"""
import json, os, sys

cache, kind, v, h, n, config = sys.argv[1:]
key = {"kind": kind, "vocab": int(v), "hidden": int(h), "dtype": "bf16", "mode": "recompute", "bias": False,
       "reduction": "mean", "targets": "i64", "arch": "sm_90a", "smem_per_block": 232448, "sm_count": 132,
       "n_bucket": 1 << (int(n) - 1).bit_length()}
text = (f"{kind}-sm_90a-smem232448-sms132-bf16-V{v}-H{h}-N{key['n_bucket']}-recompute-mean-i64-nobias")
entry = {"format": 2, "key": key, "tokens": int(n), "device": "NVIDIA H200", "default": config,
         "measured_with": {}, "candidates": [{"config": config, "ms": 1.0}]}
os.makedirs(os.path.join(cache, "tuning"), exist_ok=True)
with open(os.path.join(cache, "tuning", text + ".json"), "w") as f:
    json.dump(entry, f)
print("forced", config, "for", text)
