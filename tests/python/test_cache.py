"""The kernel cache from Python: location, offline precompilation, and (GPU) the training path
picking cached kernels up in a new process with no code change."""

import json
import os
import subprocess
import sys

import pytest

import lfce

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cache(tmp_path):
    previous = lfce.cache_dir()
    lfce.set_cache_dir(str(tmp_path))
    yield tmp_path
    lfce.set_cache_dir(previous)


def run_python(code, env_extra):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), **env_extra)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cache_dir_follows_the_environment(tmp_path):
    out = run_python("import lfce; print(lfce.cache_dir())", {"LFCE_CACHE_DIR": str(tmp_path / "c")})
    assert out.strip() == str(tmp_path / "c")


def test_set_cache_dir_accepts_a_pathlib_path(cache):
    lfce.set_cache_dir(cache / "sub")
    assert lfce.cache_dir() == str(cache / "sub")


def test_a_cache_dir_whose_name_is_not_utf8_reads_back_as_the_same_bytes(cache):
    raw = os.fsencode(str(cache)) + b"/caf\xe9"  # Latin-1, not UTF-8
    lfce.set_cache_dir(raw)
    assert os.fsencode(lfce.cache_dir()) == raw
    lfce.set_cache_dir(lfce.cache_dir())  # the str it gave is a path it takes back
    assert os.fsencode(lfce.cache_dir()) == raw


def test_set_cache_dir_names_an_empty_path(cache):
    with pytest.raises(ValueError, match="path.*''"):
        lfce.set_cache_dir("")
    assert lfce.cache_dir() == str(cache)


def test_set_cache_dir_refuses_a_nul(cache):
    with pytest.raises(ValueError, match="path.*NUL"):
        lfce.set_cache_dir(str(cache / "a\0b"))
    assert lfce.cache_dir() == str(cache)


def test_set_cache_dir_names_a_non_path():
    with pytest.raises(TypeError, match="path.*int 3"):
        lfce.set_cache_dir(3)


def test_precompile_fills_the_cache_then_hits(cache):
    first = lfce.precompile("llama2-7b", archs=("sm_90a", "sm_80"), tokens=256)
    assert len(first) == 12 and not any(k["cache_hit"] for k in first)
    assert all(k["compile_ms"] > 0 and k["ptx_size"] > 0 for k in first)
    second = lfce.precompile("llama2-7b", archs=("sm_90a", "sm_80"), tokens=256)
    assert all(k["cache_hit"] for k in second)
    assert [k["key"] for k in second] == [k["key"] for k in first]
    assert len(list((cache / "kernels").glob("*.ptx"))) == 12


def test_precompile_in_another_process_reuses_the_entries(cache):
    lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64)
    out = run_python(
        "import json, lfce; print(json.dumps(lfce.precompile(vocab=1000, hidden=64, archs='sm_80', tokens=64)))",
        {"LFCE_CACHE_DIR": str(cache)})
    assert all(k["cache_hit"] for k in json.loads(out))


def test_precompile_for_a_99_kib_gpu_picks_other_tiles(cache):
    """The default tiles depend on the GPU's shared memory (and SM count): kernels precompiled
    for the reference device are not those a 99 KiB GPU loads."""
    plain = lfce.precompile("llama3-8b", archs="sm_80", tokens=8192)
    small = lfce.precompile("llama3-8b", archs="sm_80", tokens=8192, sm_count=108, smem_per_block=101376)
    assert [k["name"] for k in small] == [k["name"] for k in plain]
    assert any(a["spec"] != b["spec"] for a, b in zip(plain, small))


def test_precompile_takes_the_loss_options_and_the_outputs_backward(cache):
    """The loss options reach the kernels' specs; an entropy or logprob output adds the backward
    kernel that takes their gradients (one more dlogits_backward, with lse_grad)."""
    plain = lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64)
    options = lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64, softcap=30.0, label_smoothing=0.1,
                              class_weight=True, outputs=("entropy", "predicted"))
    assert len(options) == len(plain) + 1
    assert options[-1]["name"] == "dlogits_backward" and "lse_grad=1" in options[-1]["spec"]
    specs = {k["name"]: k["spec"] for k in options[:-1]}
    assert "softcap=30" in specs["lse_forward"] and "entropy=1" in specs["lse_forward"]
    assert "argmax=1" in specs["lse_combine"] and "class_weight=1" in specs["lse_combine"]
    assert "lse_grad" not in specs["dlogits_backward"]
    with pytest.raises(ValueError, match=r"outputs: unknown output\(s\) \['accuracy'\]"):
        lfce.precompile(vocab=1000, hidden=64, archs="sm_80", outputs=("accuracy",))
    with pytest.raises(ValueError, match="softcap"):
        lfce.precompile(vocab=1000, hidden=64, archs="sm_80", softcap=-1.0)
    with pytest.raises(TypeError, match="shift"):
        lfce.precompile(vocab=1000, hidden=64, archs="sm_80", shift=1)


def test_precompile_takes_the_shift_for_the_kernels_that_read_targets(cache):
    """shift=True compiles the shifted kernels: exactly those that read targets (16-bit grad_input
    among them, for its target term), any sequence length (a run-time value)."""
    plain = {k["name"]: k["spec"] for k in lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64)}
    shifted = {k["name"]: k["spec"] for k in lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64,
                                                            shift=True)}
    assert shifted.keys() == plain.keys()
    reads_targets = {"lse_forward", "lse_combine", "loss_reduce", "dlogits_backward", "grad_input"}
    for name, spec in shifted.items():
        assert (spec == plain[name] + ";shift=1") if name in reads_targets else (spec == plain[name]), name


@pytest.mark.parametrize(("option", "value", "error"), [("sm_count", 0, ValueError),
                                                        ("smem_per_block", 2 ** 30 + 1, ValueError),
                                                        ("sm_count", 1.5, TypeError)])
def test_precompile_names_bad_device_limits(cache, option, value, error):
    with pytest.raises(error, match=option):
        lfce.precompile(vocab=1000, hidden=64, archs="sm_80", **{option: value})


def test_precompile_names_an_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'gpt-9'"):
        lfce.precompile("gpt-9")


def test_precompile_rejects_model_and_shape_together():
    with pytest.raises(ValueError, match="not both"):
        lfce.precompile("llama3-8b", vocab=10, hidden=8)


def test_precompile_names_a_bad_arch(cache):
    with pytest.raises(ValueError, match="sm_75"):
        lfce.precompile(vocab=1000, hidden=64, archs="sm_75")


def test_precompile_names_an_empty_arch_list(cache):
    with pytest.raises(ValueError, match=r"archs.*\[\]"):
        lfce.precompile(vocab=1000, hidden=64, archs=[])


def test_precompile_refuses_an_arch_with_a_nul(cache):
    with pytest.raises(ValueError, match="archs.*NUL"):
        lfce.precompile(vocab=1000, hidden=64, archs=["sm_80\0junk"])
    assert not (cache / "kernels").exists() or not list((cache / "kernels").iterdir())


def test_reload_options_names_a_malformed_limit(monkeypatch):
    monkeypatch.setenv("LFCE_DEVICE_SM_COUNT", "many")
    with pytest.raises(ValueError, match="LFCE_DEVICE_SM_COUNT = 'many'"):
        lfce.reload_options()
    monkeypatch.delenv("LFCE_DEVICE_SM_COUNT")
    lfce.reload_options()
