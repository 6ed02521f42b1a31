"""Settings: YAML file, SWITCHYARD_* overrides, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.settings import ConfigError, load_settings
from tests.conftest import REPO



def test_shipped_config_loads() -> None:
    settings = load_settings(REPO / "config/switchyard.yaml")
    assert settings.server.port == 8000
    assert settings.graphs["chat"].path == "graphs.chat:make_graph"
    assert settings.graphs["chat"].model == "chat-default"


def test_connection_limits_and_key_reloads_have_safe_defaults() -> None:
    settings = load_settings(REPO / "config/switchyard.yaml")
    server = settings.server
    assert (server.max_header_bytes, server.max_headers) == (65_536, 100)
    assert (server.header_timeout_s, server.body_timeout_s) == (10.0, 30.0)
    assert not server.public_api_docs and not server.allow_remote_dev
    assert settings.auth.keys_reload_s == 1.0


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text("server: {port: 9100}\ngateway: {models_file: a.yaml}\n")
    monkeypatch.setenv("SWITCHYARD_SERVER__PORT", "9200")
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path / "state"))
    settings = load_settings(config)
    assert settings.server.port == 9200
    assert settings.data_dir == tmp_path / "state"
    assert settings.gateway.models_file == Path("a.yaml")
    # Explicit overrides (CLI flags) beat the environment.
    assert load_settings(config, server={"port": 9300}).server.port == 9300


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "other.yaml"
    config.write_text("log_level: DEBUG\n")
    monkeypatch.setenv("SWITCHYARD_CONFIG", str(config))
    assert load_settings().log_level == "DEBUG"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server: {prot: 1}\n", r"server\.prot: Extra inputs are not permitted"),
        ("server: {port: 99999}\n", r"server\.port: Input should be less than or equal to 65535"),
        ("log_level: LOUD\n", r"log_level: Input should be"),
        ("graphs: {chat: {path: no_colon}}\n", r"graphs\.chat\.path: Value error, must be 'module:attribute'"),
        ("[1, 2]\n", r"top level must be a mapping"),
        ("server: {port: [\n", r"not valid YAML"),
        ("server: {max_headers: 1}\n", r"server\.max_headers: Input should be greater than or equal to 16"),
        ("server: {header_timeout_s: 0}\n", r"server\.header_timeout_s: Input should be greater than 0"),
        ("auth: {keys_reload_s: 0}\n", r"auth\.keys_reload_s: Input should be greater than 0"),
    ],
)
def test_invalid_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        load_settings(config)
    assert str(config) in str(error.value)


def test_invalid_environment_value_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_SERVER__PORT", "eighty")
    with pytest.raises(ConfigError, match=r"server\.port: Input should be a valid integer"):
        load_settings()


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_settings(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "server: {cors_origins: ['*'], cors_allow_credentials: true}\n",
            r"server: Value error, cors_origins '\*' cannot be combined with cors_allow_credentials",
        ),
        ("server: {cors_origins: ['https://ui.example.com/']}\n", r"server\.cors_origins: Value error, .* is not an origin"),
        ("server: {cors_origins: [ui.example.com]}\n", r"server\.cors_origins: Value error, .* is not an origin"),
        ("server: {cors_origin_regex: 'https://(x'}\n", r"server\.cors_origin_regex: Value error, not a regular expression"),
    ],
)
def test_invalid_cors_config_is_refused(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_cors_origins_from_the_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "switchyard.yaml"
    config.write_text("server: {cors_origins: ['https://ui.example.com', 'http://localhost:3000']}\n")
    assert load_settings(config).server.cors_origins == ("https://ui.example.com", "http://localhost:3000")
    monkeypatch.setenv("SWITCHYARD_SERVER__CORS_ORIGINS", '["*"]')
    settings = load_settings(config).server
    assert settings.cors_origins == ("*",) and not settings.cors_allow_credentials
