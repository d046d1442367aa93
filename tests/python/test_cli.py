"""``python -m lfce``'s pieces that need no GPU."""

import json
import os
import subprocess
import sys

import pytest

from lfce import __main__ as cli
from lfce import presets, ptxas

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(args, library):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), LFCE_LIBRARY=library)
    return subprocess.run([sys.executable, "-m", "lfce", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)

PTXAS_OUTPUT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'lse_forward' for 'sm_90a'
ptxas info    : Function properties for lse_forward
    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 32.737 ms
ptxas info    : Compiling entry function 'lse_combine' for 'sm_90a'
ptxas info    : Function properties for lse_combine
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
"""


def test_ptxas_report_is_parsed_per_entry():
    entries = ptxas.parse_report(PTXAS_OUTPUT)
    assert entries == {
        "lse_forward": {"stack_bytes": 0, "spill_stores": 8, "spill_loads": 12, "registers": 168,
                        "static_smem": 1024},
        "lse_combine": {"stack_bytes": 0, "spill_stores": 0, "spill_loads": 0, "registers": 4,
                        "static_smem": 0},
    }


def test_presets_hold_hidden_then_vocab():
    table = presets.table()
    assert table["llama3-8b"] == (4096, 128256)
    assert table["gemma2-2b"] == (2304, 256000)
    assert len(table) == 10
    assert presets.PRESETS is table  # the module attribute, read on first use


def test_cli_rejects_unknown_model(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli._parse_args(["--model", "gpt-5"])
    assert exit_info.value.code == 2
    assert "gpt-5" in capsys.readouterr().err


def test_cli_defaults():
    args = cli._parse_args([])
    assert (args.model, args.tokens, args.dtype, args.mode) == ("llama3-8b", 8192, "bf16", "recompute")


def test_help_works_without_the_library(tmp_path):
    done = run_cli(["--help"], str(tmp_path / "missing" / "liblfce.so"))
    assert done.returncode == 0, done.stderr
    assert "usage: python -m lfce" in done.stdout and "--model" in done.stdout


def test_cli_names_a_missing_library(tmp_path):
    missing = str(tmp_path / "missing" / "liblfce.so")
    done = run_cli(["--model", "llama3-8b"], missing)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("lfce: error: liblfce.so not found") and missing in done.stderr, done.stderr


def test_cli_names_tokens_too_wide_for_int64(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli._parse_args(["--tokens", str(2**64)])
    assert exit_info.value.code == 2
    assert str(2**64) in capsys.readouterr().err


@pytest.mark.lib
def test_main_job_prints_a_table_and_writes_json_only_to_the_json_path(tmp_path):
    library = os.environ.get("LFCE_LIBRARY") or os.path.join(REPO, "build", "liblfce.so")
    path = tmp_path / "main.json"
    done = run_cli(["--model", "gemma2-2b", "--tokens", "1024", "--ptxas", "--json", str(path)], library)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("sm_90a  lse_forward") for line in lines), done.stdout
    assert not any(line.lstrip().startswith("{") for line in lines), done.stdout  # no JSON on stdout
    assert lines[-1] == f"wrote {path}", lines[-1]
    result = json.loads(path.read_text())
    assert (result["model"], result["tokens"], result["vocab"]) == ("gemma2-2b", 1024, 256000)
    assert {row["arch"] for row in result["kernels"]} == {"sm_90a", "sm_80"}


def test_gpu_main_job_names_the_missing_benchmark_harness(monkeypatch):
    monkeypatch.setitem(sys.modules, "bench", None)  # as in an installed wheel: bench/ is not importable
    with pytest.raises(ImportError, match="from a checkout"):
        cli._import_bench()
