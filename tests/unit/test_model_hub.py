"""A model named by TAILGUARD_MODEL becomes local files (tailguard/model/hub.py): on a Hugging
Face cache laid out here, in a temporary HF_HOME. Nothing here reaches the hub: the one
download attempt goes to a closed port on this machine."""

from __future__ import annotations

import os

import pytest

from tailguard.errors import ConfigError
from tailguard.host.redis_server import free_port
from tailguard.model.hub import hub_cache_dir, missing_files, resolve_model
from tailguard.model.served import prepare_served_model

REPO = "acme/tiny-chat"
REVISION = "0123456789abcdef0123456789abcdef01234567"
MODEL_FILES = {"config.json": "{}", "tokenizer.json": "{}", "model.safetensors": "weights"}


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty HF_HOME of the test's own, offline unless a test says otherwise."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf"


def cache_model(hub_dir, repo=REPO, files=MODEL_FILES, dangling=()):
    """A snapshot laid out as huggingface_hub writes one: blobs, snapshot symlinks into them,
    refs/main naming the revision; the files in `dangling` link to a blob that is gone."""
    repo_dir = hub_dir / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / REVISION
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, (name, text) in enumerate(files.items()):
        blob = repo_dir / "blobs" / f"blob{i}"
        if name not in dangling:
            blob.write_text(text)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(REVISION)
    return snapshot


def test_a_local_directory_is_used_as_it_is(tmp_path, hf_home):
    for name, text in MODEL_FILES.items():
        (tmp_path / name).write_text(text)
    assert resolve_model(str(tmp_path)) == tmp_path


def test_a_local_directory_without_a_tokenizer_is_refused_naming_the_file(tmp_path, hf_home):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_text("weights")
    with pytest.raises(ConfigError, match=r"has no tokenizer\.json") as err:
        resolve_model(str(tmp_path))
    assert err.value.field == "TAILGUARD_MODEL"


def test_a_cached_hub_id_resolves_to_its_snapshot(hf_home):
    snapshot = cache_model(hf_home / "hub")
    assert resolve_model(REPO) == snapshot
    assert missing_files(snapshot) == []


def test_hf_hub_cache_is_where_the_cache_is_looked_up_before_hf_home(tmp_path, hf_home,
                                                                     monkeypatch):
    cache_model(hf_home / "hub")  # the HF_HOME one: not where HF_HUB_CACHE points
    other = cache_model(tmp_path / "elsewhere", repo="acme/other")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"
    assert resolve_model("acme/other") == other
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        resolve_model(REPO)


def test_an_id_nowhere_offline_is_one_error_naming_it_the_cache_and_hf_hub_offline(hf_home):
    said = []
    with pytest.raises(ConfigError) as err:
        resolve_model(REPO, say=said.append)
    text = err.value.message
    assert f"TAILGUARD_MODEL={REPO!r}" in text
    assert str(hf_home / "hub") in text and "HF_HUB_OFFLINE is set" in text
    assert said == []  # no download was tried


def test_a_cached_snapshot_missing_a_file_names_it(hf_home):
    cache_model(hf_home / "hub", dangling=("config.json",))
    with pytest.raises(ConfigError, match=r"cached snapshot .* has no config\.json; HF_HUB_OFFLINE"):
        resolve_model(REPO)


def test_a_download_that_cannot_reach_the_hub_is_one_error(hf_home, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens
    said = []
    with pytest.raises(ConfigError) as err:
        resolve_model(REPO, say=said.append)
    assert "the download failed" in err.value.message and REPO in err.value.message
    assert "HF_HUB_OFFLINE=1" in err.value.message
    assert said == [f"downloading {REPO} from the Hugging Face hub into {hf_home / 'hub'}"]


def test_a_hub_id_is_served_from_its_snapshot_under_its_own_name(hf_home, monkeypatch):
    snapshot = cache_model(hf_home / "hub")
    monkeypatch.setenv("TAILGUARD_MODEL", REPO)
    monkeypatch.delenv("TAILGUARD_SERVED_MODEL_NAME", raising=False)
    served = prepare_served_model(say=lambda _: None)
    assert served.env() == {"TAILGUARD_MODEL": str(snapshot),
                            "TAILGUARD_SERVED_MODEL_NAME": REPO}
    monkeypatch.setenv("TAILGUARD_SERVED_MODEL_NAME", "chat")  # the operator's name stands
    assert prepare_served_model(say=lambda _: None).env() == {"TAILGUARD_MODEL": str(snapshot)}


def test_a_local_model_keeps_its_path_and_names(tmp_path, hf_home, monkeypatch):
    for name, text in MODEL_FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("TAILGUARD_MODEL", str(tmp_path))
    served = prepare_served_model(say=lambda _: None)
    assert served.env() == {"TAILGUARD_MODEL": str(tmp_path)} and not served.is_demo
