"""The fast launch path of ``kernels.launch.launch``: a launch whose arguments specialise as an earlier
one did goes straight to the compiled kernel's launcher; anything that could specialise
differently goes through Triton's own ``JITFunction.run`` (here a stand-in that records calls)."""

from __future__ import annotations

import pytest
import torch
import triton
from veomni_triton.kernels import launch as launch_mod


class _Compiled:
    function = "cufunction"
    packed_metadata = "packed"

    def __init__(self, log: list) -> None:
        self.log = log

    def run(self, *args):  # the launcher: (gx, gy, gz, stream, function, packed, meta, enter, exit, *args)
        self.log.append(("fast", args))


class _Kernel:
    """Stands in for a ``triton.jit`` kernel ``k(X, n, eps, N: constexpr)``."""

    arg_names = ["X", "n", "eps", "N"]
    pre_run_hooks: list = []

    def __init__(self) -> None:
        self.log: list = []

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return _Compiled(self.log)

        return run


@pytest.fixture
def kernel(monkeypatch) -> _Kernel:
    monkeypatch.setattr(launch_mod, "_current_stream", lambda index: 77)
    monkeypatch.setattr(launch_mod, "_LAUNCH_CACHE", {})
    return _Kernel()


def paths(k: _Kernel) -> list[str]:
    return [entry[0] for entry in k.log]


def test_second_launch_of_a_specialisation_skips_triton(kernel):
    x = torch.zeros(64)
    launch_mod._fast_launch(0, kernel, (3,), (x, 64, 1e-6), {"N": 8, "num_warps": 4})
    launch_mod._fast_launch(0, kernel, (5, 2), (x, 128, 1e-5), {"N": 8, "num_warps": 4})
    assert paths(kernel) == ["triton", "fast"]
    # the arguments JITFunction.run gives the launcher: grid, stream, handle, metadata, no hooks,
    # then every kernel argument in signature order, constexprs included; a tensor as its address
    # (the launcher takes an int as the device pointer itself)
    assert kernel.log[1][1] == (5, 2, 1, 77, "cufunction", "packed", None, None, None, x.data_ptr(), 128, 1e-5, 8)


@pytest.mark.parametrize(
    "change",
    ["dtype", "misaligned", "int_one", "int_not_multiple_of_16", "int64", "constexpr", "num_warps", "device"],
)
def test_anything_triton_specialises_on_gets_its_own_entry(kernel, change):
    x = torch.zeros(64)
    args, meta, index = [x, 64, 1e-6], {"N": 8, "num_warps": 4}, 0
    launch_mod._fast_launch(index, kernel, (1,), tuple(args), dict(meta))
    if change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.bfloat16)
    elif change == "misaligned":
        args[0] = x[1:]  # 4 bytes past a 16-byte boundary
    elif change == "int_one":
        args[1] = 1
    elif change == "int_not_multiple_of_16":
        args[1] = 65
    elif change == "int64":
        args[1] = 2**40  # a multiple of 16 too, but an i64 argument
    elif change == "constexpr":
        meta["N"] = 16
    elif change == "num_warps":
        meta["num_warps"] = 8
    else:
        index = 1
    launch_mod._fast_launch(index, kernel, (1,), tuple(args), dict(meta))
    launch_mod._fast_launch(index, kernel, (1,), tuple(args), dict(meta))
    assert paths(kernel) == ["triton", "triton", "fast"]


def test_tensor_subclasses_and_unhashable_constexprs_always_take_triton(kernel):
    class Sub(torch.Tensor):
        pass

    sub = torch.zeros(64).as_subclass(Sub)
    for _ in range(2):
        launch_mod._fast_launch(0, kernel, (1,), (sub, 64, 1e-6), {"N": 8})
        launch_mod._fast_launch(0, kernel, (1,), (torch.zeros(64), 64, 1e-6), {"N": [8]})
    assert paths(kernel) == ["triton"] * 4
    assert not launch_mod._LAUNCH_CACHE


def test_launch_hooks_and_unexpected_signatures_take_triton(kernel, monkeypatch):
    x = torch.zeros(64)
    launch = lambda: launch_mod._fast_launch(0, kernel, (1,), (x, 64, 1e-6), {"N": 8})  # noqa: E731
    launch()
    runtime = triton.knobs.runtime
    hooked = runtime.launch_enter_hook
    if hasattr(hooked, "add"):  # Triton >= 3.5: a chain of hooks
        fn = lambda *a: None  # noqa: E731
        hooked.add(fn)
        try:
            launch()
        finally:
            hooked.remove(fn)
    else:
        monkeypatch.setattr(runtime, "launch_enter_hook", lambda *a: None)
        launch()
        monkeypatch.undo()
        monkeypatch.setattr(launch_mod, "_current_stream", lambda index: 77)
    launch()
    assert paths(kernel) == ["triton", "triton", "fast"]
    # a constexpr passed by default (not in the call) cannot be replayed: Triton's path, always
    other = _Kernel()
    for _ in range(2):
        launch_mod._fast_launch(0, other, (1,), (x, 64), {"N": 8})
    assert paths(other) == ["triton", "triton"]


def test_interpreter_and_cpu_launches_never_use_the_fast_path():
    if launch_mod.interpreter_active():
        assert not launch_mod._FAST_LAUNCH
    k = _Kernel()
    launch_mod.launch(-1, k, (1,), torch.zeros(4), 4, 1e-6, N=4)
    launch_mod.launch(-1, k, (1,), torch.zeros(4), 4, 1e-6, N=4)
    assert paths(k) == ["triton", "triton"]


def test_a_launcher_that_refuses_the_arguments_sends_the_key_back_to_triton(kernel, monkeypatch):
    def refuse(self, *args):
        raise TypeError("function takes exactly 12 arguments")

    monkeypatch.setattr(_Compiled, "run", refuse)
    x = torch.zeros(64)
    launch_mod._fast_launch(0, kernel, (1,), (x, 64, 1e-6), {"N": 8})
    with pytest.warns(RuntimeWarning, match="fast launch path does not fit"):
        launch_mod._fast_launch(0, kernel, (1,), (x, 64, 1e-6), {"N": 8})
    launch_mod._fast_launch(0, kernel, (1,), (x, 64, 1e-6), {"N": 8})
    assert paths(kernel) == ["triton", "triton", "triton"]


def test_the_key_refines_tritons_own_specialisation():
    # two arguments with one fast-path key must specialise alike in Triton (the NVIDIA backend
    # uses the base backend's rules), or one cached kernel would serve two of Triton's
    jit = pytest.importorskip("triton.runtime.jit")
    native = getattr(jit, "native_specialize_impl", None)
    if native is None:
        pytest.skip("this Triton specialises in Python")
    from triton.backends.compiler import BaseBackend

    buf = torch.zeros(64)
    samples = [buf, buf[1:], buf[4:], buf[2:], torch.zeros(8, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int64),
               torch.nn.Parameter(torch.zeros(8)), 0, 1, 2, 15, 16, 17, 32, -16, -1, 2**31 - 16, 2**31, 2**31 + 16,
               -(2**31), -(2**31) - 16, 2**40, 2**63 - 16, 2**63, 2**64 - 16, True, False, 0.0, 1.0, 1e-6, None]
    for a in samples:
        for b in samples:
            if type(a) is type(b) and launch_mod._arg_key(a) == launch_mod._arg_key(b):
                spec_a = native(BaseBackend, a, False, True, True)
                spec_b = native(BaseBackend, b, False, True, True)
                assert spec_a == spec_b, (a, b)
    with pytest.raises(launch_mod._NoFastPath):
        launch_mod._arg_key((1, 2))
