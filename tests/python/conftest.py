# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the Python binding tests (run through run.sh)."""
import os
import sys

import pytest

SRC = os.environ.get("ZOFFLOAD_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(SRC, "python"))


def torch_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not importable (apt-get install python3-torch)")
    return torch


@pytest.fixture
def src_root():
    return SRC
