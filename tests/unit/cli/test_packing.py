"""Packing a script or a small folder into a ConfigMap's data, and the 1 MiB
limit the API server enforces (keys and values together)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from torchfleet_cli.packing import CONFIGMAP_LIMIT_BYTES, PackingError, pack


def test_a_script_is_one_key_run_from_the_workspace(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    package = pack(script)
    assert package.data == {"train.py": "print('hi')\n"}
    assert package.items == [{"key": "train.py", "path": "train.py"}]
    assert package.entry_path == "/workspace/train.py"
    assert package.size == len("train.py") + len("print('hi')\n")


def test_a_folder_keeps_its_layout_and_leaves_caches_and_hidden_files_out(
    tmp_path: Path,
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "main.py").write_text("import model.net\n")
    (tmp_path / "model" / "net.py").write_text("X = 1\n")
    (tmp_path / "model" / "vocab.bin").write_bytes(b"\xff\x00\xfe")
    (tmp_path / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\x00")
    (tmp_path / ".git" / "HEAD").write_text("ref")
    package = pack(tmp_path, entry="main.py")
    assert package.entry_path == "/workspace/main.py"
    assert package.data == {"main.py": "import model.net\n", "model__net.py": "X = 1\n"}
    assert base64.b64decode(package.binary_data["model__vocab.bin"]) == b"\xff\x00\xfe"
    assert sorted(item["path"] for item in package.items) == [
        "main.py",
        "model/net.py",
        "model/vocab.bin",
    ]


def test_a_folder_without_its_entry_point_says_how_to_name_one(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("")
    with pytest.raises(
        PackingError, match=re.escape("no train.py to run; name the entry point with --entry")
    ):
        pack(tmp_path)


def test_exactly_the_limit_packs_and_one_byte_more_is_refused_saying_what_to_do(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(b"#" * (CONFIGMAP_LIMIT_BYTES - len("train.py")))
    assert pack(script).size == CONFIGMAP_LIMIT_BYTES
    script.write_bytes(b"#" * (CONFIGMAP_LIMIT_BYTES - len("train.py") + 1))
    with pytest.raises(PackingError) as refused:
        pack(script)
    message = str(refused.value)
    assert f"{CONFIGMAP_LIMIT_BYTES + 1:,} bytes" in message and "1 MiB" in message
    assert "build the code into your image" in message and "on a volume" in message


def test_a_folder_is_counted_whole(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    for i in range(3):
        (tmp_path / f"shard{i}.txt").write_bytes(b"x" * (CONFIGMAP_LIMIT_BYTES // 3))
    with pytest.raises(PackingError, match="over the ConfigMap limit"):
        pack(tmp_path)


def test_a_file_name_no_configmap_key_can_hold_is_named(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "my notes.txt").write_text("")
    with pytest.raises(PackingError, match=re.escape("'my notes.txt'")):
        pack(tmp_path)
