"""`secrets_file`: a node's secret and tokens in a second file, mode 600 or stricter, so the main config holds none."""

from __future__ import annotations

import json
import os

import pytest

from broker import config as broker_config
from meta import config as meta_config
from runtime.config_file import ConfigError
from tests.support.config_files import META_TOKENS, TOKENS, broker_raw, meta_raw


def _files(tmp_path, config: dict, secrets: dict, mode: int = 0o600) -> str:
    (tmp_path / "secrets.json").write_text(json.dumps(secrets))
    os.chmod(tmp_path / "secrets.json", mode)
    (tmp_path / "node.json").write_text(json.dumps({**config, "secrets_file": "secrets.json"}))
    return str(tmp_path / "node.json")


def test_the_secrets_come_from_the_secrets_file(tmp_path):
    raw = meta_raw()
    secrets = {"secret": raw.pop("secret"), "tokens": raw.pop("tokens")}
    c = meta_config.load(_files(tmp_path, raw, secrets))
    assert c.secret == "s" * 16 and c.tokens.by_role() == META_TOKENS
    b = broker_raw()
    path = _files(tmp_path, {k: v for k, v in b.items() if k != "tokens"}, {"tokens": b["tokens"]})
    assert broker_config.load(path).token == TOKENS["broker"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_secrets_file_others_may_read_is_refused(tmp_path, mode):
    raw = meta_raw()
    with pytest.raises(ConfigError) as e:
        meta_config.load(_files(tmp_path, {k: v for k, v in raw.items() if k != "tokens"}, {"tokens": raw["tokens"]},
                                mode))
    assert f"permissions {mode:04o} are too open" in str(e.value) and "chmod 600" in str(e.value)


def test_a_secrets_file_holds_secrets_only_and_each_key_once(tmp_path):
    raw = meta_raw()
    with pytest.raises(ConfigError, match="only .* belong there, not 'node'"):
        meta_config.load(_files(tmp_path, {k: v for k, v in raw.items() if k != "node"}, {"node": "m1"}))
    with pytest.raises(ConfigError, match="'tokens' is in both the config and its secrets_file"):
        meta_config.load(_files(tmp_path, raw, {"tokens": raw["tokens"]}))
    with pytest.raises(ConfigError, match="cannot read"):
        (tmp_path / "lost.json").write_text(json.dumps({**raw, "secrets_file": "missing.json"}))
        meta_config.load(str(tmp_path / "lost.json"))
