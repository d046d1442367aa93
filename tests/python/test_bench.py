"""The benchmark harness (bench/ at the repository root): its bookkeeping, FLOP counts, memory
estimates, profile tables, data file, report table and plot without a GPU; one benchmark of each
measurement on a GPU."""

import collections
import enum
import json
import os
import subprocess
import sys
import types
import zipfile

import pytest
from conftest import missing_dependency

import bench
import lfce
from bench import ab, data, gemm_profile, impls, options, report

FAKE_GPU = {"gpu": "NVIDIA H200", "driver_version": "570.86.15", "driver_cuda_version": "12.8",
            "torch": "2.5.1", "torch_cuda": "12.4"}


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "one")
    return repo


def test_git_commit_is_the_checkouts_head_and_clean(checkout, monkeypatch):
    monkeypatch.delenv("LFCE_COMMIT", raising=False)
    assert bench.git_commit(str(checkout)) == (git(checkout, "rev-parse", "HEAD"), False)


def test_lfce_commit_wins_over_a_stale_checkout(checkout, monkeypatch):
    # A device machine's copy of the tree may carry a .git whose HEAD is not what was built.
    monkeypatch.setenv("LFCE_COMMIT", "0123abc")
    assert bench.git_commit(str(checkout)) == ("0123abc", None)


def test_git_commit_reports_a_modified_checkout_as_dirty(checkout, monkeypatch):
    monkeypatch.delenv("LFCE_COMMIT", raising=False)
    (checkout / "a.txt").write_text("b\n")
    assert bench.git_commit(str(checkout)) == (git(checkout, "rev-parse", "HEAD"), True)


def test_git_commit_without_a_checkout_is_lfce_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("LFCE_COMMIT", "0123abc")
    assert bench.git_commit(str(tmp_path)) == ("0123abc", None)


def test_git_commit_without_a_checkout_or_lfce_commit_is_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("LFCE_COMMIT", raising=False)
    assert bench.git_commit(str(tmp_path)) == (None, None)


@pytest.mark.lib
def test_metadata_records_commit_generator_version_gpu_and_baseline(checkout):
    meta = bench.metadata("python3 -m bench --models llama3-8b", gpu_info=FAKE_GPU, root=str(checkout))
    assert meta["git_commit"] == git(checkout, "rev-parse", "HEAD") and meta["git_dirty"] is False
    assert meta["generator_version"] == lfce.generator_version()
    assert meta["generator_version"].startswith("lfce-gen-"), meta["generator_version"]
    assert "F.linear + F.cross_entropy" in meta["baseline"] and "bf16 logits" in meta["baseline"], meta["baseline"]
    for key, value in FAKE_GPU.items():
        assert meta[key] == value, key
    assert meta["date"][:4].isdigit() and meta["date"].endswith("+00:00"), meta["date"]
    assert meta["lfce"] == lfce.__version__ and meta["command"].startswith("python3 -m bench")
    for key in ("triton", "liger_kernel", "cut_cross_entropy"):  # the anchors' versions, None where absent
        assert key in meta, key


def test_write_json_names_the_file_by_date_and_commit(tmp_path):
    result = {"date": "2026-12-01T10:00:00+00:00", "git_commit": "0123456789abcdef0123", "results": []}
    path = bench.write_json(result, str(tmp_path / "out"))
    assert path == str(tmp_path / "out" / "bench-2026-12-01-0123456789ab.json")
    with open(path) as f:
        assert json.load(f) == result



# ---- command line ----------------------------------------------------------------------------

KNOWN = {"llama3-8b": (4096, 128256), "llama3-70b": (8192, 128256)}


def test_parse_runs_runs_a_model_at_each_token_count_unless_pinned():
    assert bench._parse_runs("llama3-8b,llama3-70b:4096", KNOWN, [2048, 8192]) == [
        ("llama3-8b", 2048), ("llama3-8b", 8192), ("llama3-70b", 4096)]


def test_parse_runs_names_an_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        bench._parse_runs("gpt-5", KNOWN, [8192])


def test_parse_runs_names_a_bad_token_count():
    with pytest.raises(ValueError, match="bad token count 'many'"):
        bench._parse_runs("llama3-8b:many", KNOWN, [8192])


def test_parse_args_defaults_to_every_implementation_at_four_token_counts():
    _, args = bench.parse_args([])
    assert args.tokens == [2048, 8192, 16384, 32768]
    assert args.impls == bench.IMPLEMENTATIONS
    assert {"cublas_4gemm", "cublas_3gemm", "lfce_recompute", "lfce_eager", "torch", "torch_compile", "liger",
            "cce", "cce_exact"} == set(bench.IMPLEMENTATIONS)
    assert args.profile_steps > 0 and not args.gemm_only and args.wheels is None


def test_parse_args_gemm_only_times_no_implementation():
    _, args = bench.parse_args(["--gemm-only", "--tokens", "8192"])
    assert args.impls == () and args.tokens == [8192]


def usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_parse_args_names_an_unknown_implementation(capsys):
    assert "unknown implementation(s) ['flash']" in usage_error(capsys, ["--impls", "torch,flash"])


def test_parse_args_names_a_bad_token_count(capsys):
    assert "bad token count 'lots'" in usage_error(capsys, ["--tokens", "2048,lots"])


def test_parse_args_names_a_zero_token_count(capsys):
    assert "token count must be >= 1, got 0" in usage_error(capsys, ["--tokens", "0"])


def test_parse_args_names_a_zero_iteration_count(capsys):
    assert "got 0, 3 and 2" in usage_error(capsys, ["--iters", "0"])


def test_parse_args_names_a_negative_time_limit(capsys):
    assert "--time-limit must be > 0 seconds, got -5.0" in usage_error(capsys, ["--time-limit", "-5"])


# ---- FLOPs, launches, memory estimates -------------------------------------------------------

def test_gemm_flops_is_two_n_h_v_per_gemm():
    assert gemm_profile.gemm_flops(8192, 4096, 128256) == 2 * 8192 * 4096 * 128256  # 8.6 TFLOP


def test_expected_launches_are_one_forward_and_one_per_vocabulary_chunk():
    assert gemm_profile.expected_launches(128256, 16384) == {
        "lse_forward": 1, "dlogits_backward": 8, "grad_weight": 8, "grad_input": 8}
    assert gemm_profile.expected_launches(4096, 4096)["grad_input"] == 1


def test_estimate_holds_the_logits_three_times_for_pytorch_and_never_for_lfce():
    n, h, v = 8192, 4096, 128256
    logits = n * v * 2
    torch_need = bench.estimate_bytes("torch", n, h, v)
    lfce_need = bench.estimate_bytes("lfce_recompute", n, h, v)
    assert torch_need - bench.estimate_bytes("cublas_4gemm", n, h, v) == 2 * logits
    assert lfce_need < bench.estimate_bytes("cublas_4gemm", n, h, v) < torch_need
    for name in bench.IMPLEMENTATIONS:  # inputs and gradients at least
        assert bench.estimate_bytes(name, n, h, v) > 2 * (n + v) * h * 2, name


def test_estimate_skips_pytorch_where_its_logits_exceed_an_h200():
    free = 139 * 2**30
    need = bench.estimate_bytes("torch", 131072, 2304, 256000)  # 3 x 62.5 GiB of bf16 logits
    assert not impls.fits(need, free)
    assert impls.fits(bench.estimate_bytes("lfce_recompute", 131072, 2304, 256000), free)
    assert impls.fits(bench.estimate_bytes("torch", 32768, 2304, 256000), free)


def test_estimate_names_an_unknown_implementation():
    with pytest.raises(ValueError, match="unknown implementation 'flash'"):
        bench.estimate_bytes("flash", 8192, 4096, 128256)


# ---- the anchors: wheels and imports ---------------------------------------------------------

def make_wheel(folder, package, source):
    folder.mkdir(exist_ok=True)
    path = folder / f"{package}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{package}/__init__.py", source)
        wheel.writestr(f"{package}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    return path


def test_add_wheels_makes_a_wheel_importable_without_pip(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    make_wheel(tmp_path / "wheels", "lfce_bench_fake_anchor", "ANSWER = 42\n")
    assert impls.add_wheels(str(tmp_path / "wheels")) == ["lfce_bench_fake_anchor-1.0-py3-none-any.whl"]
    import lfce_bench_fake_anchor

    assert lfce_bench_fake_anchor.ANSWER == 42
    assert os.path.isfile(lfce_bench_fake_anchor.__file__)  # unpacked: Triton reads kernel sources from disk
    del sys.modules["lfce_bench_fake_anchor"]


def test_add_wheels_names_a_folder_without_wheels(tmp_path):
    with pytest.raises(ValueError, match=f"wheel folder '{tmp_path}' holds no .whl file"):
        impls.add_wheels(str(tmp_path))


def test_add_wheels_names_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match=f"wheel folder '{tmp_path / 'nowhere'}'"):
        impls.add_wheels(str(tmp_path / "nowhere"))


def test_add_wheels_names_a_wheel_that_is_not_a_zip(tmp_path):
    (tmp_path / "broken-1.0-py3-none-any.whl").write_text("not a zip")
    with pytest.raises(ValueError, match="broken-1.0-py3-none-any.whl' is not a zip file"):
        impls.add_wheels(str(tmp_path))


def test_an_anchor_that_cannot_be_imported_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", None)
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)
    with pytest.raises(impls.Unavailable, match="Liger-Kernel not importable"):
        impls.load("liger")
    with pytest.raises(impls.Unavailable, match="Cut Cross-Entropy not importable"):
        impls.load("cce_exact")


def fake_cce(monkeypatch, impl_names):
    calls = []
    module = types.ModuleType("cut_cross_entropy")
    module.LinearCrossEntropyImpl = enum.IntEnum("LinearCrossEntropyImpl", [n.upper() for n in impl_names])
    module.linear_cross_entropy = lambda *args, **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", module)
    return calls


def test_cce_exact_is_cce_without_gradient_filtering_where_the_release_lacks_it(monkeypatch):
    calls = fake_cce(monkeypatch, ["cce", "torch_compile"])  # PyPI's 25.1.1
    impl = impls.load("cce_exact")
    impl.forward(None, None, None)
    assert calls == [{"ignore_index": -100, "impl": "cce", "filter_eps": None}]
    assert impl.config == "impl='cce', filter_eps=None"


def test_cce_exact_uses_the_release_s_own_exact_implementation(monkeypatch):
    calls = fake_cce(monkeypatch, ["cce", "cce_exact", "torch_compile"])
    impls.load("cce_exact").forward(None, None, None)
    impls.load("cce").forward(None, None, None)
    assert calls == [{"ignore_index": -100, "impl": "cce_exact"}, {"ignore_index": -100, "impl": "cce"}]


def test_load_names_an_unknown_implementation():
    with pytest.raises(ValueError, match="unknown implementation 'flash'"):
        impls.load("flash")


# ---- profile tables from a trace -------------------------------------------------------------

TRACE = {"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "lse_forward", "dur": 2000.0},
    {"ph": "X", "cat": "kernel", "name": "lse_forward", "dur": 2200.0},
    {"ph": "X", "cat": "kernel", "name": "dlogits_backward", "dur": 1000.0},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 10.0},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 5.0},  # host side: not device time
    {"ph": "i", "cat": "kernel", "name": "marker"},
]}


def test_device_activity_counts_kernels_and_memsets_only():
    assert gemm_profile.device_activity(TRACE) == {"lse_forward": [2, 4200.0], "dlogits_backward": [1, 1000.0],
                                                   "Memset (Device)": [1, 10.0]}


def test_median_activity_takes_each_kernels_median_over_the_rounds():
    rounds = [{"lse_forward": [2, 30.0], "grad_input": [16, 5.0]},
              {"lse_forward": [2, 10.0]},
              {"lse_forward": [2, 11.0], "grad_input": [16, 7.0], "Memset (Device)": [1, 1.0]}]
    # (an outlying round moves a mean, 17.0 here, not the median)
    assert gemm_profile.median_activity(rounds) == {"lse_forward": [2, 11.0], "grad_input": [16, 6.0],
                                                    "Memset (Device)": [1, 1.0]}


def test_breakdown_is_per_step_longest_first_with_shares():
    rows = gemm_profile.breakdown(gemm_profile.device_activity(TRACE), steps=2)
    assert [r["name"] for r in rows] == ["lse_forward", "dlogits_backward", "Memset (Device)"]
    assert rows[0]["count"] == 1 and rows[0]["total_ms"] == pytest.approx(2.1)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)


def test_gemm_rows_compare_tflops_with_cublas_and_name_a_missing_kernel():
    n, h, v = 8192, 4096, 128256
    flops = gemm_profile.gemm_flops(n, h, v)
    activity = {"lse_forward": [2, 2 * 20000.0]}  # two steps of 20 ms
    cublas = {"lse_forward": (10.0, ["nvjet_tst"]), "grad_input": (11.0, ["nvjet_tst"])}
    rows = {r["kernel"]: r for r in gemm_profile.gemm_rows(activity, cublas, n, h, v, 2,
                                                          gemm_profile.expected_launches(v, 16384))}
    forward = rows["lse_forward"]
    assert forward["launches"] == 1 == forward["launches_expected"]
    assert forward["tflops"] == pytest.approx(flops / 20e-3 / 1e12)
    assert forward["cublas_tflops"] == pytest.approx(flops / 10e-3 / 1e12)
    assert forward["vs_cublas"] == pytest.approx(0.5)
    assert rows["grad_input"]["error"] == "no 'grad_input' kernel in the profiler trace"
    assert "vs_cublas" not in rows["grad_input"] and "cublas_ms" not in rows["grad_weight"]
    assert rows["grad_weight"]["launches_expected"] == 8


# ---- text, JSON and plot ---------------------------------------------------------------------

def entry(model="llama3-8b", tokens=8192, scale=1.0):
    return {"model": model, "tokens": tokens, "hidden": 4096, "vocab": 128256, "dtype": "bfloat16",
            "methods": {"cublas_4gemm": {"total_ms": 50.0 * scale, "held_mib": 0.0, "useful_tflops": 500.0,
                                         "vs_cublas_4gemm": 1.0},
                        "lfce_recompute": {"forward_ms": 30.0, "backward_ms": 67.0, "total_ms": 97.0 * scale,
                                           "held_mib": 0.03, "peak_mib": 1450.0, "useful_tflops": 250.0,
                                           "vs_cublas_4gemm": 1.94, "tuned": True},
                        "torch": {"error": "out of memory: tried to allocate 4 GiB"},
                        "liger": {"skipped": "Liger-Kernel not importable (liger_kernel.transformers.functional): "
                                             "ModuleNotFoundError: No module named 'triton'"}}}


def test_format_result_shows_errors_skips_and_whether_tuned():
    lines = bench.format_result(entry())
    assert "lfce_recompute" in lines[3] and lines[3].split()[-1] == "yes" and lines[3].split()[-2] == "1.94", lines[3]
    assert lines[2].split()[-1] == "-", lines[2]
    assert lines[4] == "torch           out of memory: tried to allocate 4 GiB", lines[4]
    assert lines[5].startswith("liger           skipped: Liger-Kernel not importable"), lines[5]


def test_format_result_shows_the_profile():
    row = {"kernel": "lse_forward", "launches": 1, "ms": 20.0, "tflops": 430.0, "cublas_ms": 10.0,
           "cublas_tflops": 860.0, "vs_cublas": 0.5}
    profiled = dict(entry(), profile={"steps": 2, "chunk": 16384, "gemms": [row],
                                      "kernels": [{"name": "lse_forward", "count": 1, "total_ms": 20.0, "share": 1.0}]})
    text = "\n".join(bench.format_result(profiled))
    assert "backward chunk 16384" in text and "0.500" in text and "100.0%" in text, text


def test_timed_out_sees_a_shape_cut_by_the_time_limit():
    cut = entry()
    cut["methods"]["cce"] = {"skipped": "time limit reached"}
    assert bench._timed_out(cut) and not bench._timed_out(entry())


def result(**extra):
    return {"date": "2026-12-01T10:00:00+00:00", "git_commit": "0123456789abcdef0123", "gpu": "NVIDIA H200",
            "driver_version": "580.1", "torch": "2.11.0", "generator_version": "lfce-gen-1", "complete": True,
            "settings": {"iters": 14},
            "results": [entry(tokens=n, scale=n / 8192) for n in (2048, 8192)] + [entry("gemma2-2b", 8192)],
            **extra}


def test_data_rows_are_one_per_measured_implementation_and_shape():
    rows = data.rows(result())
    assert [(r["model"], r["tokens"], r["impl"]) for r in rows] == [
        ("llama3-8b", "2048", "cublas_4gemm"), ("llama3-8b", "2048", "lfce_recompute"),
        ("llama3-8b", "8192", "cublas_4gemm"), ("llama3-8b", "8192", "lfce_recompute"),
        ("gemma2-2b", "8192", "cublas_4gemm"), ("gemma2-2b", "8192", "lfce_recompute")]  # no failed or skipped row
    row = rows[3]
    assert list(row) == list(data.COLUMNS)
    assert (row["commit"], row["gpu"], row["driver"], row["dtype"], row["iters"]) == (
        "0123456789abcdef0123", "NVIDIA H200", "580.1", "bf16", "14")
    assert (row["total_ms"], row["held_mib"], row["vs_cublas_4gemm"], row["tuned"], row["variant"]) == (
        "97.000", "0.03", "1.9400", "1", "")


def test_data_append_writes_the_header_once_and_reads_back(tmp_path):
    path = str(tmp_path / "data" / "benchmark.csv")
    assert data.append(path, data.rows(result())) == 6
    assert data.append(path, data.rows(result(date="2026-12-02T10:00:00+00:00", complete=False))) == 6
    rows = data.read(path)
    with open(path) as f:
        assert len(rows) == 12 and f.read().count("date,commit,") == 1
    assert rows[0]["total_ms"] == 12.5 and rows[0]["tokens"] == 2048 and rows[0]["complete"]
    assert not rows[-1]["complete"]


def test_data_append_refuses_a_file_with_other_columns(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        data.append(str(path), data.rows(result()))


def test_data_rows_of_the_options_benchmark_name_each_variant():
    options_result = {"date": "2026-12-01T10:00:00+00:00", "git_commit": "abc", "model": "llama3-8b", "tokens": 8192,
                      "hidden": 4096, "vocab": 128256, "dtype": "bf16", "mode": "recompute", "iters": 10,
                      "results": {"plain": {"forward_ms": 10.0, "total_ms": 50.0},
                                  "softcap": {"forward_ms": 11.0, "total_ms": 52.0},
                                  "class_weight": {"error": "ValueError: class_weight"}}}
    rows = data.rows(options_result)
    assert [(r["impl"], r["variant"], r["total_ms"]) for r in rows] == [
        ("lfce_recompute", "plain", "50.000"), ("lfce_recompute", "softcap", "52.000")]


def csv_file(tmp_path):
    path = str(tmp_path / "benchmark.csv")
    data.append(path, data.rows(result()))
    data.append(path, data.rows(result(date="2026-12-02T10:00:00+00:00", complete=False)))  # cut: not current
    return path


def test_report_table_is_the_newest_complete_benchmark_with_each_modes_floor_ratio(tmp_path):
    rows = report.current(data.read(csv_file(tmp_path)))
    assert {r["date"] for r in rows} == {"2026-12-01T10:00:00+00:00"}
    lines = report.table(rows)
    assert "median of 14" in lines[0] and "0123456789ab" in lines[0], lines[0]
    assert lines[2] == "| shape (N, H, V) | 4 cuBLAS GEMMs | lfce recompute |", lines[2]
    assert lines[5] == "| llama3-8b (8192, 4096, 128256) | 50.0 | 97.0 (1.94×) |", lines[5]
    assert lines[-1] == "| held / peak MiB, llama3-8b N = 2048 | 0 / – | 0.03 / 1450 |", lines[-1]


def test_report_picks_a_benchmark_by_date_and_names_a_missing_one(tmp_path):
    rows = data.read(csv_file(tmp_path))
    assert {r["date"] for r in report.current(rows, "2026-12-02")} == {"2026-12-02T10:00:00+00:00"}
    with pytest.raises(ValueError, match="dated 2027"):
        report.current(rows, "2027")


def test_report_plot_writes_a_png(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip(missing_dependency("matplotlib is not installed: the plot is not tested"))
    png = tmp_path / "plot.png"
    assert report.main(["--csv", csv_file(tmp_path), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_names_a_missing_data_file(tmp_path, capsys):
    assert report.main(["--csv", str(tmp_path / "none.csv"), "--table"]) == 2
    assert "none.csv" in capsys.readouterr().err


def test_the_checkouts_data_file_has_a_current_benchmark():
    rows = data.read(data.DEFAULT_CSV)
    assert report.table(report.current(rows)) and report.options_table(report.current(rows, options=True))


# ---- options: each loss option's cost -----------------------------------------------------------

def options_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["options", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_options_default_to_every_option_plain_first():
    _, args = options.parse_args([])
    assert args.options == tuple(options.OPTIONS) and args.options[0] == "plain"
    assert {"softcap", "temperature", "z_loss", "label_smoothing", "class_weight", "smoothing_and_weights",
            "weight_grad_accumulator"} < set(args.options)
    assert (args.model, args.tokens, args.dtype, args.mode, args.iters, args.warmup) == (
        "llama3-8b", 8192, "bf16", "recompute", 10, 3)


def test_options_always_time_plain_first_and_each_option_once():
    _, args = options.parse_args(["--options", "z_loss,softcap,z_loss"])
    assert args.options == ("plain", "z_loss", "softcap")


def test_options_in_eager_mode_leave_out_the_accumulator_by_default():
    _, args = options.parse_args(["--mode", "eager"])
    assert "weight_grad_accumulator" not in args.options and "softcap" in args.options


def test_options_name_an_unknown_option(capsys):
    assert "unknown option(s) ['bias']" in options_usage_error(capsys, ["--options", "softcap,bias"])


def test_options_name_an_accumulator_in_eager_mode(capsys):
    err = options_usage_error(capsys, ["--mode", "eager", "--options", "weight_grad_accumulator"])
    assert "option(s) ['weight_grad_accumulator'] need --mode recompute, got --mode eager" in err, err


def test_options_name_a_zero_iteration_count(capsys):
    assert "must be >= 1, got 0, 3 and 8192" in options_usage_error(capsys, ["--iters", "0"])


@pytest.mark.lib
def test_options_name_an_unknown_model(capsys):
    assert "--model 'gpt-5' is not a preset" in options_usage_error(capsys, ["--model", "gpt-5"])


@pytest.mark.lib
def test_options_need_a_gpu(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs a CUDA GPU" in options_usage_error(capsys, ["--iters", "1"])


def fake_step(times, calls):
    """A time_step for options.interleave: ``times[name]`` ms a step (forward half), recorded in ``calls``."""
    def time_step(name):
        calls.append(name)
        if name == "class_weight":
            raise ValueError("class_weight is not supported with float16 inputs\nsecond line")
        return lambda: (times[name] / 2, times[name])
    return time_step


def test_interleave_balances_the_order_and_drops_a_failing_variant():
    calls = []
    rows = options.interleave(("plain", "softcap", "class_weight", "z_loss"), 1, 2,
                              fake_step({"plain": 10.0, "softcap": 10.5, "z_loss": 12.0}, calls))
    # Four names: orders 0 1 3 2, 1 2 0 3, ...; the first round meets the failure, then three names'
    # orders (0 1 2, 1 2 0, 2 0 1, 2 1 0, ...) go on from the round's index.
    assert calls == ["plain", "softcap", "z_loss", "class_weight",
                     "softcap", "z_loss", "plain", "z_loss", "plain", "softcap"]
    assert list(rows) == ["plain", "softcap", "class_weight", "z_loss"]
    assert rows["class_weight"] == {"error": "ValueError: class_weight is not supported with float16 inputs"}
    assert rows["softcap"]["vs_plain"] == pytest.approx(1.05) and rows["plain"]["vs_plain"] == 1.0
    assert rows["z_loss"]["forward_ms"] == 6.0 and rows["z_loss"]["forward_vs_plain"] == pytest.approx(1.2)


@pytest.mark.parametrize("count", range(1, 11))
def test_balanced_orders_let_every_name_follow_every_other_equally_often(count):
    orders = options.balanced_orders(count)
    assert len(orders) == {1: 2, 2: 1}.get(count, count if count % 2 == 0 else 2 * count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    within = collections.Counter((order[i], order[i + 1]) for order in orders for i in range(count - 1))
    if count != 2:  # (two alternate: 1 follows 0 within the round, 0 follows 1 across rounds)
        assert set(within) == {(a, b) for a in range(count) for b in range(count) if a != b}
        assert len(set(within.values())) <= 1, within  # each ordered pair equally often within rounds
    # The stream the card sees, round after round with no sync, the cycle repeating: no name after
    # itself, and each ordered pair k or k + 1 times.
    stream = [index for order in orders for index in order]
    follows = collections.Counter(zip(stream, stream[1:] + stream[:1]))
    if count > 1:
        assert not [pair for pair in follows if pair[0] == pair[1]], follows
        assert max(follows.values()) - min(follows.values()) <= 1, follows


def test_interleave_steps_follow_each_neighbour_equally_over_a_cycle():
    """Over a whole cycle of orders (14 rounds for seven names, the main harness's impls) each name's
    step follows every other name's twice within the rounds, two or three times in the whole stream
    of steps (no sync between rounds), and never its own."""
    names = [f"impl{i}" for i in range(7)]
    calls = []
    options.interleave(names, 0, 14, fake_step(dict.fromkeys(names, 1.0), calls))
    rounds = [calls[i:i + 7] for i in range(0, len(calls), 7)]
    within = collections.Counter((r[i], r[i + 1]) for r in rounds for i in range(6))
    assert len(within) == 42 and set(within.values()) == {2}, within
    stream = collections.Counter(zip(calls, calls[1:]))
    assert len(stream) == 42 and set(stream.values()) <= {2, 3}, stream


def test_interleave_takes_the_median_of_the_timed_rounds_only():
    results = iter([(100.0, 100.0), (1.0, 2.0), (1.0, 4.0), (1.0, 3.0)])  # the first is the warm-up

    def time_step(name):
        value = next(results)
        return lambda: value
    rows = options.interleave(("plain",), 1, 3, time_step)
    assert rows["plain"] == {"forward_ms": 1.0, "total_ms": 3.0, "min_ms": 2.0, "max_ms": 4.0,
                             "forward_vs_plain": 1.0, "vs_plain": 1.0}


@pytest.mark.lib
def test_options_main_writes_the_json_and_the_csv_and_prints_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LFCE_COMMIT", "0123456789abcdef0123")
    path, csv_path = tmp_path / "options.json", tmp_path / "data.csv"
    argv = ["--options", "softcap,class_weight", "--iters", "2", "--warmup", "1", "--json", str(path),
            "--csv", str(csv_path)]
    calls = []
    assert options.main(argv, fake_step({"plain": 20.0, "softcap": 21.0}, calls), gpu_info=FAKE_GPU) == 0
    assert [(r["variant"], r["total_ms"]) for r in data.read(str(csv_path))] == [("plain", 20.0), ("softcap", 21.0)]
    result = json.loads(path.read_text())
    assert result["git_commit"] == "0123456789abcdef0123" and result["gpu"] == "NVIDIA H200"
    assert result["generator_version"] == lfce.generator_version()
    assert result["command"] == "python3 -m bench options " + " ".join(argv)
    assert calls == ["plain", "softcap", "class_weight", "plain", "softcap", "plain", "softcap"]  # then two alternate
    assert (result["model"], result["tokens"], result["hidden"], result["dtype"], result["mode"]) == (
        "llama3-8b", 8192, 4096, "bf16", "recompute")
    assert set(result["options"]) == set(result["results"]) == {"plain", "softcap", "class_weight"}
    assert result["results"]["softcap"]["vs_plain"] == pytest.approx(1.05)
    assert "error" in result["results"]["class_weight"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("llama3-8b: N=8192 H=4096 V=128256 bf16 mode=recompute"), lines[0]
    assert lines[3].split() == ["softcap", "10.50", "1.050", "21.00", "1.050"], lines[3]
    assert lines[4].startswith("class_weight             ValueError: class_weight"), lines[4]
    assert lines[5:] == [f"wrote {path}", f"appended 2 rows to {csv_path}"]


def test_interleaved_times_every_implementation_in_turn_after_its_first_step_alone(monkeypatch):
    """measure._interleaved: each implementation's first step alone (first_call_s), one that fails
    there gets its error and no rounds, the others warmup - 1 + iters balanced rounds; backward_ms is
    total less forward."""
    pytest.importorskip("torch")
    from bench import measure

    first = []

    def first_step(impl, x, w, y):
        first.append(impl)
        if impl == "broken":
            raise RuntimeError("Triton compile failed\nsecond line")
        return 0.5
    calls = []
    monkeypatch.setattr(measure, "_first_step", first_step)
    monkeypatch.setattr(measure, "_step_timer",
                        lambda loaded, x, w, y: fake_step({"a": 10.0, "b": 30.0}, calls))
    rows = measure._interleaved({"a": "a", "broken": "broken", "b": "b"}, None, None, None, 2, 3)
    assert first == ["a", "broken", "b"]
    assert calls == ["a", "b"] * 4  # 1 warm-up round + 3 timed; two names alternate
    assert rows["broken"] == {"error": "RuntimeError: Triton compile failed"}
    assert rows["a"] == {"forward_ms": 5.0, "backward_ms": 5.0, "total_ms": 10.0, "min_ms": 10.0, "max_ms": 10.0,
                         "first_call_s": 0.5}
    assert rows["b"]["backward_ms"] == 15.0 and rows["b"]["first_call_s"] == 0.5


# ---- ab: eager against cuBLAS's three GEMMs, power-settled, tiles pinned ---------------------------

def ab_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["ab", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("force, message", [
    ("grad_weight", "expected KIND=CANDIDATE"),
    ("grad_weight=", "expected KIND=CANDIDATE"),
    ("lse_forward=128x256x64/wg2/s4", "kind 'lse_forward' is not one of eager's GEMMs"),
    ("grad_input=128x256x64/wg2/s4;chunk=16384", "a grad_input candidate is a tile alone"),
    ("dlogits_backward=128x256x64/wg2/s4;ctas=132", "a dlogits_backward candidate ends in ';chunk=N'"),
    ("dlogits_backward=128x256x64/wg2/s4;chunk=0", "N a positive vocabulary chunk, got ';chunk=0'"),
    ("dlogits_backward=;chunk=16384", "the candidate has no tile"),
    ("lse_forward=128x256x64/wg2/s4;ctas=132", "kind 'lse_forward' is not one of eager's GEMMs"),
])
def test_ab_rejects_a_bad_force_naming_it(capsys, force, message):
    err = ab_usage_error(capsys, ["--model", "llama3-8b", "--force", force])
    assert message in err and repr(force) in err


def test_ab_rejects_bad_counts_a_kind_forced_twice_an_unknown_model_and_a_bad_out(capsys, tmp_path):
    assert "--steps must be at least 1, got 0" in ab_usage_error(capsys, ["--model", "llama3-8b", "--steps", "0"])
    assert "--settle must be at least 0, got -1" in ab_usage_error(capsys, ["--model", "llama3-8b", "--settle", "-1"])
    twice = ["--model", "llama3-8b", "--force", "grad_weight=128x256x64/wg2/s4", "--force", " grad_weight = x"]
    assert "--force names grad_weight twice" in ab_usage_error(capsys, twice)
    assert "--model: unknown model 'llama9'" in ab_usage_error(capsys, ["--model", "llama9"])
    (tmp_path / "file").write_text("")
    assert f"--out {str(tmp_path / 'file')!r}" in ab_usage_error(capsys, ["--model", "llama3-8b", "--out",
                                                                          str(tmp_path / "file")])


def test_ab_tuning_key_limits_follow_the_device_and_lfces_overrides():
    h200 = ((9, 0), 232448, 132)
    assert ab.device_limits(*h200, {}) == ("sm_90a", 232448, 132)
    # The arch table caps the device's opt-in limit; LFCE_DEVICE_* override the device's figures.
    assert ab.device_limits((9, 0), 300000, 132, {}) == ("sm_90a", 232448, 132)
    env = {"LFCE_DEVICE_SMEM_LIMIT": "100000", "LFCE_DEVICE_SM_COUNT": "64"}
    assert ab.device_limits(*h200, env) == ("sm_90a", 100000, 64)
    assert ab.device_limits(*h200, {"LFCE_DEVICE_ARCH": "sm_80"}) == ("sm_80", 166912, 132)
    assert ab.device_limits((8, 0), 166912, 108, {}) == ("sm_80", 166912, 108)


def test_ab_adds_the_plans_chunk_to_dlogits_candidates_only():
    assert ab.with_chunk("dlogits_backward", "128x256x64/wg2/s4", 16384) == "128x256x64/wg2/s4;chunk=16384"
    assert ab.with_chunk("dlogits_backward", "128x256x64/wg2/s4;chunk=4096", 16384) == "128x256x64/wg2/s4;chunk=4096"
    assert ab.with_chunk("grad_weight", "128x256x64/wg2/s4/c2", 16384) == "128x256x64/wg2/s4/c2"


def test_ab_tuning_entries_are_what_the_library_plans_with(tmp_path):
    """The entries --force writes (ab.tuning_entry) are read by the library: an offline precompile
    for an H200's limits in eager mode builds each forced kernel with the forced tile, and
    ab.unapplied finds nothing missing; without them the defaults, and unapplied names each."""
    vocab, hidden, tokens, limits = 50257, 2040, 8192, {"sm_count": 132, "smem_per_block": 232448}
    forced = [("dlogits_backward", "128x256x64/wg2/s4/c2;chunk=16384"), ("grad_weight", "128x128x64/wg2/s4"),
              ("grad_input", "128x256x64/wg2/s4")]
    before = lfce.cache_dir()
    try:
        lfce.set_cache_dir(tmp_path / "plain")
        plain = lfce.precompile(vocab=vocab, hidden=hidden, archs=("sm_90a",), mode="eager", tokens=tokens, **limits)
        assert len(ab.unapplied(forced, plain, hidden)) == 3, [r["spec"] for r in plain]
        (tmp_path / "forced" / "tuning").mkdir(parents=True)
        for kind, candidate in forced:
            for mode in ("recompute", "eager"):
                name, entry = ab.tuning_entry(kind, candidate, vocab, hidden, tokens, mode, "sm_90a", **limits)
                (tmp_path / "forced" / "tuning" / name).write_text(json.dumps(entry))
        lfce.set_cache_dir(tmp_path / "forced")
        rows = lfce.precompile(vocab=vocab, hidden=hidden, archs=("sm_90a",), mode="eager", tokens=tokens, **limits)
    finally:
        lfce.set_cache_dir(before)
    assert ab.unapplied(forced, rows, hidden) == [], [r["spec"] for r in rows]
    tiles = {r["spec"].split(";")[0]: ab.tile_of(r["spec"]) for r in rows if f";H={hidden};" in r["spec"]}
    assert (tiles["eager_logits"], tiles["grad_weight"], tiles["grad_input"]) == (
        "128x256x64/wg2/s4/c2", "128x128x64/wg2/s4", "128x256x64/wg2/s4")
    # A dlogits_backward candidate without its chunk is not one: the library warns and ignores it.
    chunkless = [("dlogits_backward", "128x256x64/wg2/s4/c2")]
    (tmp_path / "chunkless" / "tuning").mkdir(parents=True)
    for mode in ("recompute", "eager"):
        name, entry = ab.tuning_entry(*chunkless[0], vocab, hidden, tokens, mode, "sm_90a", **limits)
        (tmp_path / "chunkless" / "tuning" / name).write_text(json.dumps(entry))
    try:
        lfce.set_cache_dir(tmp_path / "chunkless")
        ignored = lfce.precompile(vocab=vocab, hidden=hidden, archs=("sm_90a",), mode="eager", tokens=tokens, **limits)
    finally:
        lfce.set_cache_dir(before)
    assert ab.unapplied(chunkless, ignored, hidden)


def test_ab_summarises_each_side_over_its_phases_samples():
    t0 = ab.datetime.datetime(2026, 12, 2, 12, 0, 0)

    def at(seconds):
        return t0 + ab.datetime.timedelta(seconds=seconds)
    text = "\n".join([
        "timestamp, power.draw.instant [W], clocks.sm [MHz]",  # a header: skipped
        f"{at(0.1).strftime(ab.SMI_TIME)}, 100.0, 1900",       # inside eager's first 0.2 s: dropped
        f"{at(0.5).strftime(ab.SMI_TIME)}, 690.0, 1400",
        f"{at(0.9).strftime(ab.SMI_TIME)}, 700.0, 1380",
        f"{at(1.2).strftime(ab.SMI_TIME)}, [N/A], 1500",       # unparseable: skipped
        f"{at(1.5).strftime(ab.SMI_TIME)}, 680.0, 1450",
    ])
    samples = ab.parse_smi(text)
    assert len(samples) == 4
    phases = [("eager", at(0), at(1), 80.0), ("cublas", at(1), at(2), 76.0)]
    s = ab.summarise(phases, samples)
    assert s["eager"]["watts"] == pytest.approx(695.0) and s["eager"]["mhz"] == pytest.approx(1390.0)
    assert s["eager"]["joules"] == pytest.approx(695.0 * 0.080)
    assert s["cublas"]["watts"] == pytest.approx(680.0) and s["ratio"] == pytest.approx(80.0 / 76.0)
    line = ab.format_summary("llama3-70b", 8192, "defaults", s)
    assert "eager  80.00 ms   695 W  1390 MHz" in line and line.endswith("ratio 1.053")
