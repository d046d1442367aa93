"""Cold start: the first forward + backward of lfce in this (fresh) process with an empty cache.

    python3 scripts/cold_start.py [--model llama3-8b] [--tokens 8192] [--out result.json]

Times, with the GPU synchronised at each end, from just before the first lfce call (CUDA
context, inputs and torch already set up, so only lfce's own start is counted) to the end of
the first backward: generating the kernels with LLVM, the driver's JIT, loading and running.
The cache directory is a new temporary folder, removed afterwards. Then times a second
forward + backward (kernels loaded) for comparison. Prints one line and writes JSON.
"""

import argparse
import json
import sys
import tempfile
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    if args.tokens < 1:
        parser.error(f"--tokens must be at least 1, not {args.tokens}")

    import torch

    import lfce
    from lfce import presets

    table = presets.table()
    if args.model not in table:
        parser.error(f"unknown --model {args.model!r}; presets: {', '.join(sorted(table))}")
    hidden, vocab = table[args.model]
    with tempfile.TemporaryDirectory(prefix="lfce-cold-") as cache:
        lfce.set_cache_dir(cache)
        g = torch.Generator(device="cuda").manual_seed(0)
        n, h, v = args.tokens, hidden, vocab
        x = (torch.randn(n, h, device="cuda", generator=g)).bfloat16().requires_grad_()
        w = (torch.randn(v, h, device="cuda", generator=g) * h ** -0.5).bfloat16().requires_grad_()
        y = torch.randint(0, v, (n,), device="cuda", generator=g)

        def step():
            torch.cuda.synchronize()
            start = time.perf_counter()
            lfce.linear_cross_entropy(x, w, y).backward()
            torch.cuda.synchronize()
            return time.perf_counter() - start

        first = step()
        second = step()
    result = {"model": args.model, "tokens": n, "hidden": h, "vocab": v, "first_s": round(first, 3),
              "second_s": round(second, 3), "gpu": torch.cuda.get_device_name()}
    print(f"cold start {args.model} N={n}: first fwd+bwd {first:.3f} s (empty cache), second {second:.3f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
