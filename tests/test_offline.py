"""Nothing in the library downloads at run time: these machines reach no hub and no URL."""

import os
import re
import subprocess
import sys
from pathlib import Path

import rookworld_lib

LIB = Path(rookworld_lib.__file__).parent

# Calls that fetch from the network: tiktoken's registry, the Hugging Face hub and datasets, urllib.
DOWNLOADING = re.compile(r"\b(get_encoding|encoding_for_model|hf_hub_download|snapshot_download|load_dataset|"
                         r"urlopen|urlretrieve|requests\.(get|post))\s*\(")


def test_no_downloading_call_in_the_library():
    modules = sorted(LIB.rglob("*.py"))  # the three layers' packages (a flat glob would see only __init__.py)
    assert len(modules) >= 30 and {p.parent.name for p in modules} >= {"core", "chess", "lab"}, modules
    hits = [f"{path.relative_to(LIB)}:{i}: {line.strip()}" for path in modules
            for i, line in enumerate(path.read_text().splitlines(), 1) if DOWNLOADING.search(line)]
    assert hits == []


def test_the_cache_lives_under_xdg_cache_home_else_home_else_a_per_user_temporary_folder(monkeypatch, tmp_path):
    """XDG's rule ($XDG_CACHE_HOME, by default ~/.cache); a container's arbitrary uid has no HOME and no
    passwd entry (Path.home() raises): a folder of that uid's own in the temporary directory."""
    import tempfile

    from rookworld_lib.core.paths import cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "rookworld"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "rookworld"

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cache_dir() == Path(tempfile.gettempdir()) / f"rookworld-cache-{os.getuid()}"


OFFLINE_SCRIPT = r"""
import socket, tiktoken, tiktoken.load, tiktoken.registry

def refuse(*args, **kwargs):
    raise AssertionError("network access attempted")

socket.socket.connect = refuse
socket.create_connection = refuse
tiktoken.get_encoding = refuse
tiktoken.registry.get_encoding = refuse
tiktoken.load.read_file = refuse

import torch
from rookworld_lib.core import tokenizer
from rookworld_lib.chess import tasks
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.sampling import SamplingConfig, generate

enc = tokenizer.get_tokenizer()
ids = tokenizer.encode(tasks.policy_prompt("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"))
assert enc.decode(ids).startswith("P: rnbqkbnr")
torch.manual_seed(0)
ro = generate(GPT(GPTConfig.preset("tiny")), [ids], SamplingConfig(max_new_tokens=4, seed=0))
print("offline ok", len(ids), ro.completions(enc)[0] is not None)
"""


def test_tokenizer_and_sampling_work_with_the_network_refused(tmp_path):
    # A fresh interpreter with an empty tiktoken cache, sockets and tiktoken's fetchers refused.
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=str(LIB.parent), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "offline ok" in out.stdout
