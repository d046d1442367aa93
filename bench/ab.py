"""Eager mode against cuBLAS's three GEMMs, power-settled, in one process: how eager's tiles are chosen.

    python3 -m bench ab --model llama3-70b --tokens 8192
    python3 -m bench ab --model llama3-70b --force grad_weight=128x256x64/wg2/s4/c2 --label pairs-m
    for v in a b a b; do python3 -m bench ab --model gemma2-2b $(flags $v); done   # alternate variants

On the H200 eager mode's step runs at the card's power cap (690-700 W), where its clock, and so its
time, follows its energy per step: a change that lowers the energy wins even when it is slower at a
locked clock (docs/measurements.md#eager-energy). The main harness interleaves single steps of every
implementation; this runs each side for long enough to settle at the cap: --settle untimed steps,
then --steps timed back to back (CUDA events), eager (``lfce_eager``) and cuBLAS's three GEMMs
(``cublas_3gemm``) alternating, --rounds times each, with `nvidia-smi -lms 50` sampling power and
SM clock (samples in a phase's first 0.2 s dropped). Prints ms, W, MHz and J a step of each side and
eager / cuBLAS. Variants are compared by alternating processes of each (a shell loop), each against
the cuBLAS of its own process.

--force KIND=CANDIDATE (repeatable) pins one GEMM's tile for the run: a tuning entry (the format
``lfce tune`` writes) in a fresh cache directory, which the process then uses. KIND is one of eager's
three GEMMs by their tuning names (dlogits_backward: eager_logits runs its tile; grad_weight;
grad_input), CANDIDATE what ``lfce tune`` prints (a tile such as ``128x256x64/wg2/s4/c2``; a
dlogits_backward candidate carries ``;chunk=N``, the plan's own chunk when left out). After the first
step each forced kernel's loaded tile is checked: a candidate the library rejects (it warns why) would
otherwise run the default without a word.

Each run uses a fresh cache directory (removed when it ends), so a run without --force runs the
defaults whatever the user's cache has tuned. --out DIR writes ab-<label>-<time>-<date>-<commit>.json
there (meta.metadata(), the settings, each phase and the summary); the exit status is 1 where a forced
tile did not run or nvidia-smi gave no samples.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from .meta import metadata, write_json

# Tuning kind -> the kernel that runs its tile in eager mode.
FORCEABLE = {"dlogits_backward": "eager_logits", "grad_weight": "grad_weight", "grad_input": "grad_input"}
SIDES = ("eager", "cublas")
SMI_QUERY = "timestamp,power.draw.instant,clocks.sm"
SMI_TIME = "%Y/%m/%d %H:%M:%S.%f"
SKIP_SECONDS = 0.2  # samples this soon after a phase starts still show the previous phase


def parse_force(text):
    """(kind, candidate) of a --force value "KIND=CANDIDATE"; ValueError naming what is wrong. The
    tile itself is the library's to check (a candidate it rejects is reported after the first step)."""
    kind, sep, candidate = text.partition("=")
    kind, candidate = kind.strip(), candidate.strip()
    if not sep or not candidate:
        raise ValueError(f"--force {text!r}: expected KIND=CANDIDATE, e.g. grad_weight=128x256x64/wg2/s4/c2")
    if kind not in FORCEABLE:
        raise ValueError(f"--force {text!r}: kind {kind!r} is not one of eager's GEMMs ({', '.join(FORCEABLE)})")
    tile, semicolon, extra = candidate.partition(";")
    if semicolon and kind != "dlogits_backward":
        raise ValueError(f"--force {text!r}: a {kind} candidate is a tile alone (no ';...')")
    if semicolon:
        chunk = extra[len("chunk="):] if extra.startswith("chunk=") else None
        if chunk is None or not chunk.isdigit() or int(chunk) < 1:
            raise ValueError(f"--force {text!r}: a dlogits_backward candidate ends in ';chunk=N', N a positive "
                             f"vocabulary chunk, got {';' + extra!r}")
    if not tile:
        raise ValueError(f"--force {text!r}: the candidate has no tile")
    return kind, candidate


def with_chunk(kind, candidate, chunk):
    """The candidate text lfce's tuning files hold: dlogits_backward's with ";chunk=N" (``chunk``
    where the candidate has none)."""
    if kind == "dlogits_backward" and ";" not in candidate:
        return f"{candidate};chunk={int(chunk)}"
    return candidate


def tuning_entry(kind, candidate, vocab, hidden, tokens, mode, arch, smem_per_block, sm_count, dtype="bf16"):
    """(file name, JSON) of the tuning entry that makes ``candidate`` the winner of ``kind`` for one
    problem (mean reduction, int64 targets, no bias) on a device with these limits: the key and
    file name runtime/tuning_files.cpp reads (TuningKey::text, key_json; format 2)."""
    bucket = 1 << max(0, (int(tokens) - 1).bit_length())
    key = {"kind": kind, "vocab": int(vocab), "hidden": int(hidden), "dtype": dtype, "mode": mode, "bias": False,
           "reduction": "mean", "targets": "i64", "arch": arch, "smem_per_block": int(smem_per_block),
           "sm_count": int(sm_count), "n_bucket": bucket}
    name = (f"{kind}-{arch}-smem{int(smem_per_block)}-sms{int(sm_count)}-{dtype}-V{int(vocab)}-H{int(hidden)}"
            f"-N{bucket}-{mode}-mean-i64-nobias.json")
    entry = {"format": 2, "key": key, "tokens": int(tokens), "device": "bench ab --force", "default": candidate,
             "measured_with": {}, "candidates": [{"config": candidate, "ms": 1.0}]}
    return name, entry


def tile_of(spec):
    """The tile field of a kernel spec text ("...;tile=128x256x64/wg2/s4/c2;..." -> the tile)."""
    for field in spec.split(";"):
        if field.startswith("tile="):
            return field[len("tile="):]
    return None


def unapplied(forced, load_stats, hidden):
    """Messages for each forced (kind, candidate) whose kernel did not load with its tile, from
    lfce.kernel_load_stats() (kernels of hidden size ``hidden``)."""
    tiles = {}
    for k in load_stats:
        spec = k["spec"]
        if f";H={hidden};" in spec:
            tiles.setdefault(spec.split(";", 1)[0], set()).add(tile_of(spec))
    problems = []
    for kind, candidate in forced:
        kernel, want = FORCEABLE[kind], candidate.split(";", 1)[0]
        got = tiles.get(kernel, set())
        if want not in got:
            problems.append(f"{kind}={candidate}: {kernel} ran {', '.join(sorted(t for t in got if t)) or 'nothing'}"
                            " (the tuning was not used: the library rejected the candidate, with a warning, or"
                            " found no tuning file for this problem and device)")
    return problems


def parse_smi(text):
    """[(time, watts, MHz)] of `nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits` lines;
    lines that do not parse (a header, an "[N/A]") are skipped."""
    samples = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            samples.append((datetime.datetime.strptime(fields[0], SMI_TIME), float(fields[1]), float(fields[2])))
        except (ValueError, IndexError):
            continue
    return samples


def summarise(phases, samples, skip_seconds=SKIP_SECONDS):
    """{side: {ms, watts, mhz, joules, phases}} over phases [(side, start, end, ms a step)] and the
    samples inside each phase (after its first ``skip_seconds``), plus "ratio" (eager / cuBLAS ms).
    A phase without samples counts as NaN watts and MHz."""
    nan = float("nan")
    per_side = {}
    for side, start, end, ms in phases:
        inside = [s for s in samples if start + datetime.timedelta(seconds=skip_seconds) <= s[0] <= end]
        watts = statistics.mean(s[1] for s in inside) if inside else nan
        mhz = statistics.mean(s[2] for s in inside) if inside else nan
        per_side.setdefault(side, []).append((ms, watts, mhz))
    out = {}
    for side, rows in per_side.items():
        ms, watts, mhz = (statistics.mean(r[i] for r in rows) for i in range(3))
        out[side] = {"ms": ms, "watts": watts, "mhz": mhz, "joules": watts * ms / 1e3, "phases": len(rows)}
    if "eager" in out and "cublas" in out:
        out["ratio"] = out["eager"]["ms"] / out["cublas"]["ms"]
    return out


def format_summary(model, tokens, label, summary):
    line = f"{model} N={tokens} {label}"
    for side in SIDES:
        s = summary[side]
        line += f" | {side} {s['ms']:6.2f} ms {s['watts']:5.0f} W {s['mhz']:5.0f} MHz {s['joules']:5.2f} J"
    return line + f" | ratio {summary['ratio']:.3f}"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python3 -m bench ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model preset (lfce.presets)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens N (default 8192)")
    parser.add_argument("--force", action="append", default=[], metavar="KIND=CANDIDATE",
                        help=f"pin one GEMM's tile ({', '.join(FORCEABLE)}); repeatable")
    parser.add_argument("--label", default="", help="a name for this variant in the output")
    parser.add_argument("--steps", type=int, default=30, help="timed steps a phase (default 30)")
    parser.add_argument("--settle", type=int, default=12, help="untimed steps before each phase (default 12)")
    parser.add_argument("--rounds", type=int, default=2, help="phases of each side (default 2)")
    parser.add_argument("--out", metavar="DIR", help="write ab-<date>-<commit>.json there")
    args = parser.parse_args(argv)
    for name in ("tokens", "steps", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.settle < 0:
        parser.error(f"--settle must be at least 0, got {args.settle}")
    try:
        args.force = [parse_force(text) for text in args.force]
    except ValueError as error:
        parser.error(str(error))
    from lfce import presets

    known = presets.table()
    if args.model not in known:
        parser.error(f"--model: unknown model {args.model!r}; known: {', '.join(sorted(known))}")
    kinds = [kind for kind, _ in args.force]
    for kind in kinds:
        if kinds.count(kind) > 1:
            parser.error(f"--force names {kind} twice")
    if args.out:
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as error:
            parser.error(f"--out {args.out!r}: {error.strerror}")
        if not os.access(args.out, os.W_OK):
            parser.error(f"--out {args.out!r}: not writable")
    return parser, args


# The opt-in shared memory per block of each arch's table (runtime/arch.cpp): the tuning key holds the
# device's limit capped by it (runtime/tuning_files.cpp, effective_limits).
ARCH_SMEM = {"sm_90a": 232448, "sm_80": 166912}


def device_limits(capability, smem_optin, sm_count, environ):
    """(arch, smem_per_block, sm_count) of the tuning key lfce uses for a device of ``capability``
    with these limits, after the environment's overrides (LFCE_DEVICE_ARCH=sm_80,
    LFCE_DEVICE_SMEM_LIMIT, LFCE_DEVICE_SM_COUNT: runtime/options.h)."""
    arch = "sm_90a" if tuple(capability) == (9, 0) and environ.get("LFCE_DEVICE_ARCH", "") != "sm_80" else "sm_80"
    smem = int(environ.get("LFCE_DEVICE_SMEM_LIMIT") or smem_optin)
    sms = int(environ.get("LFCE_DEVICE_SM_COUNT") or sm_count)
    return arch, min(smem, ARCH_SMEM[arch]), sms


def _smi_gpu(props):
    """nvidia-smi's id of the GPU torch calls device 0 (its UUID), or None where torch lacks it."""
    uuid = getattr(props, "uuid", None)
    return f"GPU-{uuid}" if uuid else None


def _measure(torch, steps, args, gpu):
    """(phases [(side, start, end, ms a step)], nvidia-smi's output, its exit status): --rounds of
    each side's --settle untimed then --steps timed steps, alternating, sampled throughout."""
    # Sampled into a file, not a pipe, which would fill (about 1 KB a second) and stall nvidia-smi.
    with tempfile.TemporaryFile(mode="w+") as samples:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits", "-lms", "50",
                                *(["-i", gpu] if gpu else [])], stdout=samples, stderr=subprocess.DEVNULL)
        phases = []
        try:
            for _ in range(args.rounds):
                for side in SIDES:
                    for _ in range(args.settle):
                        steps[side]()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    began = datetime.datetime.now()
                    start.record()
                    for _ in range(args.steps):
                        steps[side]()
                    end.record()
                    torch.cuda.synchronize()
                    phases.append((side, began, datetime.datetime.now(), start.elapsed_time(end) / args.steps))
        finally:
            smi.terminate()
            smi.wait()
        samples.seek(0)
        return phases, samples.read(), smi.returncode


def main(argv=None):
    parser, args = parse_args(sys.argv[1:] if argv is None else list(argv))
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    from lfce import cache, presets

    hidden, vocab = presets.table()[args.model]
    props = torch.cuda.get_device_properties(0)
    # Always a fresh cache directory (removed when done, the process's own restored): a variant runs
    # its forced tiles, the defaults run the defaults, whatever tunings the user's cache holds.
    before = cache.cache_dir()
    folder = tempfile.mkdtemp(prefix="lfce-bench-ab-")
    try:
        return _run(args, argv, torch, props, hidden, vocab, folder)
    finally:
        cache.set_cache_dir(before)
        shutil.rmtree(folder, ignore_errors=True)


def _run(args, argv, torch, props, hidden, vocab, folder):
    from lfce import _lib, cache

    from . import impls

    os.makedirs(os.path.join(folder, "tuning"))
    forced = []
    if args.force:
        arch, smem, sms = device_limits((props.major, props.minor),
                                        getattr(props, "shared_memory_per_block_optin", ARCH_SMEM["sm_90a"]),
                                        props.multi_processor_count, os.environ)
        chunk = _lib.backward_chunk_size(_lib.make_problem(args.tokens, hidden, vocab, _lib.DTYPE_BF16))
        for kind, candidate in args.force:
            candidate = with_chunk(kind, candidate, chunk)
            forced.append((kind, candidate))
            for mode in ("recompute", "eager"):  # the key holds the normalised spec's mode
                name, entry = tuning_entry(kind, candidate, vocab, hidden, args.tokens, mode, arch, smem, sms)
                with open(os.path.join(folder, "tuning", name), "w") as f:
                    json.dump(entry, f)
    cache.set_cache_dir(folder)
    x, w, y = impls.make_inputs(args.tokens, hidden, vocab, torch.bfloat16)
    steps = {}
    for side, name in zip(SIDES, ("lfce_eager", "cublas_3gemm")):
        impl = impls.load(name)

        def step(impl=impl):
            impl.backward(impl.forward(x, w, y), x, w)
        steps[side] = step
    for step in steps.values():
        step()
    torch.cuda.synchronize()
    problems = unapplied(forced, cache.kernel_load_stats(), hidden)
    if problems:
        print("bench ab: a forced tile did not run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    try:
        phases, text, smi_status = _measure(torch, steps, args, _smi_gpu(props))
    except OSError as error:
        print(f"bench ab: cannot run nvidia-smi: {error}", file=sys.stderr)
        return 1
    summary = summarise(phases, parse_smi(text))
    print(format_summary(args.model, args.tokens, args.label or "defaults", summary), flush=True)
    unsampled = [side for side in SIDES if summary[side]["watts"] != summary[side]["watts"]]  # NaN
    if unsampled:
        print(f"bench ab: nvidia-smi gave no power samples during the {' and '.join(unsampled)} phases "
              f"(exit status {smi_status}; it needs {SMI_QUERY})", file=sys.stderr)
    if args.out:
        result = metadata("python3 -m bench ab " + " ".join(sys.argv[1:] if argv is None else argv))
        result.update(settings={"model": args.model, "tokens": args.tokens, "label": args.label,
                                "forced": [f"{k}={c}" for k, c in forced], "steps": args.steps,
                                "settle": args.settle, "rounds": args.rounds, "dtype": "bf16", "reduction": "mean"},
                      phases=[{"side": s, "start": a.isoformat(), "end": b.isoformat(), "ms": ms}
                              for s, a, b, ms in phases],
                      summary=summary)
        # One file per process: alternating variants share a date and commit.
        tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in (args.label or "defaults"))
        stamp = datetime.datetime.now().strftime("%H%M%S")
        print("wrote", write_json(result, args.out, prefix=f"ab-{tag}-{stamp}"))
    return 1 if unsampled else 0
