"""engine/config.py: the KF_* environment, read through pydantic-settings at call time, with errors naming the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import config
from engine.errors import ConfigurationError
from engine.proposers.llm_settings import LLMSettings


def test_settings_follow_the_environment_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_HOME", str(tmp_path / "one"))
    assert config.kf_home() == tmp_path / "one"
    monkeypatch.setenv("KF_HOME", str(tmp_path / "two"))
    assert config.kf_home() == tmp_path / "two" and config.cache_dir() == tmp_path / "two" / "cache"
    # Relative to the working directory where the command runs, as the default `.kf` is.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KF_HOME", "state")
    assert config.kf_home() == tmp_path / "state"
    monkeypatch.delenv("KF_HOME")
    assert config.kf_home() == tmp_path / ".kf"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("KF_DATABASE_URL", "KF_TEMPORAL_ADDRESS", "KF_TEMPORAL_PORT", "KF_TEMPORAL_UI_PORT", "KF_METRICS_PORT")
    for name in names:
        monkeypatch.setenv(name, "")
    assert config.database_url_override() is None and config.temporal_address_override() is None
    assert config.temporal_ports() == (config.DEFAULT_TEMPORAL_PORT, config.DEFAULT_TEMPORAL_UI_PORT)
    assert config.metrics_port() is None


def test_the_web_ui_port_follows_the_grpc_port_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KF_TEMPORAL_UI_PORT", raising=False)
    monkeypatch.setenv("KF_TEMPORAL_PORT", "7300")
    assert config.temporal_ports() == (7300, 8300)
    monkeypatch.setenv("KF_TEMPORAL_UI_PORT", " 9000 ")
    assert config.temporal_ports() == (7300, 9000)


def test_every_malformed_variable_is_named_with_its_fix_whichever_setting_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KF_METRICS_PORT", "http")
    monkeypatch.setenv("KF_PROBLEM_CALL_S", "nan")
    monkeypatch.setenv("KF_PROBLEM_REPLY_MB", "-5")
    # A command that only wants the state folder still says what is wrong, rather than failing later.
    with pytest.raises(ConfigurationError) as raised:
        config.kf_home()
    message = str(raised.value)
    assert "KF_METRICS_PORT='http' is not a port from 1 to 65535; unset it for no metrics" in message
    assert "KF_PROBLEM_CALL_S='nan' is not a number of seconds > 0" in message and "KF_PROBLEM_CALL_S=600" in message
    assert "KF_PROBLEM_REPLY_MB='-5' is not a positive number of MB" in message
    monkeypatch.delenv("KF_METRICS_PORT")
    monkeypatch.delenv("KF_PROBLEM_CALL_S")
    monkeypatch.setenv("KF_PROBLEM_REPLY_MB", "2.5")
    assert config.problem_reply_bytes() == 2_500_000


@pytest.mark.parametrize("port", ["0", "65536", "-1", "7233x", "1e3"])
def test_a_port_outside_tcps_range_is_refused(port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_TEMPORAL_UI_PORT", port)
    with pytest.raises(ConfigurationError, match=rf"KF_TEMPORAL_UI_PORT='{port}' is not a TCP port"):
        config.temporal_ports()


def test_the_readme_and_the_llm_guide_list_every_setting() -> None:
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    table = readme[readme.index("## Configuration") : readme.index("## Exit status")]
    for field in config.Settings.model_fields:
        assert f"`KF_{field.upper()}`" in table, f"KF_{field.upper()} is missing from the README's configuration"
    guide = (root / "docs" / "llm-proposers.md").read_text()
    for name, info in LLMSettings.model_fields.items():
        variable = info.validation_alias if isinstance(info.validation_alias, str) else f"KF_LLM_{name.upper()}"
        assert re.search(rf"\b{variable}\b", guide), f"{variable} is missing from docs/llm-proposers.md"
