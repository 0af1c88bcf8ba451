"""Shared by the tests of the Python package (run from CTest with
PYTHONPATH=<build>/python and TESSERA_BUILD_DIR=<build>)."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

import tessera

BUILD = pathlib.Path(os.environ.get("TESSERA_BUILD_DIR", pathlib.Path(tessera.__file__).parents[2]))
SOURCE = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = SOURCE / "tests" / "data" / "mindspore"


def run(*args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def ckpt_bin():
    return BUILD / "cli" / "ckpt"


@pytest.fixture(scope="session")
def sliced(tmp_path_factory):
    """A synthetic GPT checkpoint with Adam moments, sliced over dp2 x tp2 with ZeRO."""
    d = tmp_path_factory.mktemp("sliced") / "ck"
    run(BUILD / "samples" / "make_checkpoint", "-o", d, "--mesh", "dp=2,tp=2", "--zero",
        "--optimizer", "--layers", "2", "--embed", "128", "--vocab", "256", "--context", "64")
    return d


def whole(reader):
    """Every tensor of a reader, whole, copied."""
    return {n: np.array(reader.read(n)) for n in reader.keys()}
