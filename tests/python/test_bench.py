"""The benchmark harness's bookkeeping, without a GPU: what a result file records and where."""

import json
import subprocess

import pytest

import lfce
from lfce import bench

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
    meta = bench.metadata("python3 -m lfce.bench --models llama3-8b", gpu_info=FAKE_GPU, root=str(checkout))
    assert meta["git_commit"] == git(checkout, "rev-parse", "HEAD") and meta["git_dirty"] is False
    assert meta["generator_version"] == lfce.generator_version()
    assert meta["generator_version"].startswith("lfce-gen-"), meta["generator_version"]
    assert "F.linear + F.cross_entropy" in meta["baseline"] and "bf16 logits" in meta["baseline"], meta["baseline"]
    for key, value in FAKE_GPU.items():
        assert meta[key] == value, key
    assert meta["date"][:4].isdigit() and meta["date"].endswith("+00:00"), meta["date"]
    assert meta["lfce"] == lfce.__version__ and meta["command"].startswith("python3 -m lfce.bench")


def test_write_json_names_the_file_by_date_and_commit(tmp_path):
    result = {"date": "2026-12-01T10:00:00+00:00", "git_commit": "0123456789abcdef0123", "results": []}
    path = bench.write_json(result, str(tmp_path / "out"))
    assert path == str(tmp_path / "out" / "bench-2026-12-01-0123456789ab.json")
    with open(path) as f:
        assert json.load(f) == result


def test_parse_runs_reads_model_and_tokens():
    known = {"llama3-8b": (4096, 128256), "llama3-70b": (8192, 128256)}
    assert bench._parse_runs("llama3-8b,llama3-70b:4096", known) == [("llama3-8b", bench.DEFAULT_TOKENS),
                                                                      ("llama3-70b", 4096)]


def test_parse_runs_names_an_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        bench._parse_runs("gpt-5", {"llama3-8b": (4096, 128256)})


def test_parse_runs_names_a_bad_token_count():
    with pytest.raises(ValueError, match="bad token count 'many'"):
        bench._parse_runs("llama3-8b:many", {"llama3-8b": (4096, 128256)})


def test_format_result_shows_errors_and_whether_tuned():
    entry = {"model": "llama3-8b", "tokens": 8192, "hidden": 4096, "vocab": 128256, "dtype": "bfloat16",
             "methods": {"cublas_4gemm": {"total_ms": 50.0, "useful_tflops": 500.0},
                         "lfce_recompute": {"forward_ms": 30.0, "backward_ms": 67.0, "total_ms": 97.0,
                                            "held_mib": 0.03, "peak_mib": 1450.0, "useful_tflops": 250.0,
                                            "tuned": True},
                         "torch": {"error": "out of memory: tried to allocate 4 GiB"}}}
    lines = bench.format_result(entry)
    assert "lfce_recompute" in lines[3] and lines[3].split()[-1] == "yes", lines[3]
    assert lines[2].split()[-1] == "-", lines[2]
    assert lines[4] == "torch           out of memory: tried to allocate 4 GiB", lines[4]


@pytest.mark.gpu
def test_run_measures_every_method_and_says_whether_lfce_was_tuned():
    methods = bench.FLOOR_METHODS + ("lfce_recompute", "lfce_eager", "torch")
    entry = bench.run("tiny", 256, 4096, 512, methods=methods, warmup=1, iters=2)
    assert list(entry["methods"]) == list(methods)
    for name, row in entry["methods"].items():
        assert "error" not in row, (name, row)
        assert row["total_ms"] > 0 and row["useful_tflops"] > 0 and "vs_cublas_4gemm" in row, (name, row)
        assert ("tuned" in row) == name.startswith("lfce_"), (name, row)
        if name.startswith("lfce_"):
            assert isinstance(row["tuned"], bool), (name, row)
    assert entry["methods"]["torch"]["held_mib"] > 0  # the baseline keeps its [N, V] logits
    json.dumps(entry)  # the figures go into the JSON file as they are
