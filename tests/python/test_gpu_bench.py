"""The benchmark harness (bench/) on a GPU: every implementation measured, the per-kernel profile
against cuBLAS, the JSON and CSV outputs, the option sweep and the power-settled A/B."""

import json

import pytest

import bench
from bench import data, gemm_profile, options

ANCHORS = ("torch_compile", "liger", "cce", "cce_exact")  # may be absent (no Triton, no wheel): then skipped


@pytest.mark.gpu
def test_run_measures_every_method_and_says_whether_lfce_was_tuned():
    methods = tuple(m for m in bench.IMPLEMENTATIONS if m != "torch_compile")  # compiling takes ~30 s
    entry = bench.run("tiny", 256, 4096, 512, methods=methods, warmup=1, iters=2)
    assert list(entry["methods"]) == list(methods)
    for name, row in entry["methods"].items():
        if name in ANCHORS and "skipped" in row:
            assert "not importable" in row["skipped"], (name, row)
            continue
        assert "error" not in row and "skipped" not in row, (name, row)
        assert row["total_ms"] > 0 and row["useful_tflops"] > 0 and "vs_cublas_4gemm" in row, (name, row)
        assert row["peak_mib"] > 0 and row["first_call_s"] > 0, (name, row)
        assert ("tuned" in row) == name.startswith("lfce_"), (name, row)
        if name.startswith("lfce_"):
            assert isinstance(row["tuned"], bool), (name, row)
    assert entry["methods"]["torch"]["held_mib"] > 0  # the baseline keeps its [N, V] logits
    assert entry["methods"]["cublas_3gemm"]["held_mib"] >= 512 * 4096 * 2 / 2**20  # the eager floor keeps them too
    assert entry["methods"]["lfce_recompute"]["held_mib"] < 1  # LSE and the count
    json.dumps(entry)  # the figures go into the JSON file as they are


@pytest.mark.gpu
def test_profile_times_each_lfce_gemm_kernel_against_cublas():
    entry = bench.run("tiny", 256, 4096, 512, methods=("cublas_4gemm",), warmup=1, iters=1, profile_steps=1)
    profile = entry["profile"]
    assert "error" not in profile, profile
    for row in profile["gemms"]:
        assert "error" not in row, row
        assert row["launches"] == row["launches_expected"], row
        assert row["tflops"] > 0 and row["cublas_tflops"] > 0 and row["vs_cublas"] > 0, row
        assert row["cublas_kernels"], row
    names = {row["name"] for row in profile["kernels"]}
    assert set(gemm_profile.GEMM_KERNELS) <= names, names
    assert sum(row["share"] for row in profile["kernels"]) == pytest.approx(1.0)


@pytest.mark.gpu
def test_main_writes_the_json_and_the_csv_with_every_shape(tmp_path):
    path, csv_path = tmp_path / "out" / "bench.json", tmp_path / "data.csv"
    assert bench.main(["--models", "llama3-8b", "--tokens", "256,512", "--impls", "cublas_4gemm,lfce_recompute",
                       "--iters", "1", "--warmup", "1", "--profile-steps", "1", "--json", str(path),
                       "--csv", str(csv_path)]) == 0
    rows = data.read(str(csv_path))
    assert [(r["tokens"], r["impl"]) for r in rows] == [(256, "cublas_4gemm"), (256, "lfce_recompute"),
                                                        (512, "cublas_4gemm"), (512, "lfce_recompute")]
    result = json.loads(path.read_text())
    assert result["complete"] is True and result["gpu"] and "git_commit" in result
    assert [(e["model"], e["tokens"]) for e in result["results"]] == [("llama3-8b", 256), ("llama3-8b", 512)]
    for e in result["results"]:
        assert "error" not in e["profile"] and set(e["methods"]) == {"cublas_4gemm", "lfce_recompute"}, e


@pytest.mark.gpu
def test_options_times_every_option_against_plain(tmp_path):
    path = tmp_path / "options.json"
    assert bench.main(["options", "--model", "llama3-8b", "--tokens", "256", "--iters", "2", "--warmup", "1",
                       "--json", str(path), "--no-csv"]) == 0
    result = json.loads(path.read_text())
    assert sorted(result["results"]) == sorted(options.OPTIONS) and result["gpu"]  # the JSON sorts its keys
    for name, row in result["results"].items():
        assert "error" not in row, (name, row)
        assert row["total_ms"] > row["forward_ms"] > 0 and row["vs_plain"] > 0, (name, row)


@pytest.mark.gpu
def test_ab_runs_the_forced_tile_and_samples_both_sides(tmp_path):
    """bench ab end to end: a forced grad_weight tile runs (its check passes), both sides get
    nvidia-smi samples (half a second or more of steps a phase), and the JSON has the summary."""
    argv = ["ab", "--model", "llama3-8b", "--tokens", "2048", "--steps", "60", "--settle", "2", "--rounds", "1",
            "--force", "grad_weight=128x128x64/wg2/s4", "--label", "test", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    [path] = list(tmp_path.iterdir())
    assert path.name.startswith("ab-test-")
    result = json.loads(path.read_text())
    assert result["settings"]["forced"] == ["grad_weight=128x128x64/wg2/s4"] and result["gpu"]
    for side in ("eager", "cublas"):
        row = result["summary"][side]
        assert row["ms"] > 0 and row["watts"] > 0 and row["mhz"] > 0 and row["phases"] == 1, (side, row)
    assert result["summary"]["ratio"] == pytest.approx(result["summary"]["eager"]["ms"] / result["summary"]["cublas"]["ms"])
    # A candidate the library rejects (a pair along M cannot split B's 192 columns) is reported.
    assert bench.main(argv[:-4] + ["--force", "grad_input=128x192x64/wg2/s4/c2"]) == 1
