"""How this process's threads wait for the GPU (kiln.set_gpu_wait; `kiln serve --spin-wait` is the
C++ server's): the mode is checked, it does nothing without a GPU, and on a GPU it lands on the
device's context and is refused once that context exists."""
import subprocess
import sys
import textwrap

import pytest
from conftest import gpu_reason

import kiln
from kiln import _kiln
from kiln import set_gpu_wait


def test_unknown_mode_is_a_value_error():
    with pytest.raises(kiln.KilnValueError, match="unknown GPU wait mode 'sleepy' "
                                                  r"\(one of: block, spin, yield, auto\)"):
        set_gpu_wait("sleepy")


@pytest.mark.skipif(not gpu_reason(), reason="a GPU is usable here (the GPU case below runs)")
@pytest.mark.parametrize("mode", ["block", "spin", "yield", "auto"])
def test_without_a_gpu_it_does_nothing(mode):
    assert set_gpu_wait(mode) == 0
    assert _kiln.gpu_wait(0) == ""


@pytest.mark.skipif(not gpu_reason(), reason="a GPU is usable here (the GPU case below runs)")
def test_cpu_engine_runs_after_it(cnn_engine):
    import numpy as np

    ctx = cnn_engine.create_context()
    x = np.zeros((1, 3, 32, 32), np.float32)
    before = ctx.run({"input": x})
    # After a context exists: the cpu backend has no device context, so any mode is taken.
    assert set_gpu_wait("block") == 0
    after = ctx.run({"input": x})
    for n in before:
        assert np.array_equal(before[n], after[n])


@pytest.mark.skipif(bool(gpu_reason()), reason=gpu_reason() or "")
def test_on_a_gpu_it_sets_the_context_and_is_refused_once_made():
    # A fresh process: this one's GPU contexts may exist already.
    code = textwrap.dedent("""
        import kiln
        from kiln import _kiln
        from kiln import set_gpu_wait
        n = kiln.device_count()
        assert set_gpu_wait("block") == n, n
        assert _kiln.gpu_wait(0) == "block", _kiln.gpu_wait(0)
        _kiln.device_empty([4], "float32")  # makes device 0's context
        assert set_gpu_wait("block") == n    # the same mode again: fine
        try:
            set_gpu_wait("spin")
        except kiln.KilnError as e:
            assert "CUDA device 0 already has its context (waiting 'block')" in str(e), e
        else:
            raise AssertionError("set_gpu_wait('spin') after the context was made")
        assert _kiln.gpu_wait(0) == "block"
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_env())
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def _env():
    import os

    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kiln.__file__)), os.environ.get("PYTHONPATH", "")]))
