"""Quantized routes: the published W4A8/W8A8 arithmetic by hand, the Triton kernel against
the reference (exactly, interpreted), the FlagGems route against a fake and the real thing,
the option-set cache, and route selection on a simulated FlagOS host.

Triton tests (names with "interpret") run in a TRITON_INTERPRET=1 subprocess; see
tests/engine/test_kernels.py.
"""

import os
import platform
import sys
import types

import pytest
import torch

from vllm_pcd_kernels import QuantizedHead, project, quantize_head, select_route
from vllm_pcd_kernels import w4a8
from vllm_pcd_kernels.quantized_head import pack_int4, unpack_int4
from vllm_pcd_kernels.w4a8 import quantize_activations, quantize_w4, quantize_w8, w4a8_reference
from tests.conftest import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted_only = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 "
                                      "subprocess of test_triton_interpreted")
VOCAB = 2000
ENV = ("PCD_PROJECTION", "FLAGGEMS_VENDOR", "FLAGGEMS_ARM_Q4_STRICT", "FL_INT8_LMHEAD")


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")  # pytest shows it when the test fails
    return torch.Generator().manual_seed(seed)


def draw(gen, batch, hidden, k, shared=False):
    h = torch.randn(batch, hidden, generator=gen)
    w = (torch.randn(VOCAB, hidden, generator=gen) / hidden ** 0.5).to(torch.bfloat16)
    allowed = torch.randint(0, VOCAB, (k,) if shared else (batch, k), generator=gen)
    allowed[..., -1] = allowed[..., 0]
    return h, w, allowed


def row(*values, size=128):
    return torch.tensor([list(values) + [0.0] * (size - len(values))])


# ---------------------------------------------------------------- the arithmetic by hand

@pytest.mark.parametrize("values,codes,zero,scale", [
    # range [-0.5, 1]: m = 255/1.5 = 170; -128 + (-85) + 127 + 170 > 0 -> zp = -128 + 85
    ((1.0, -0.5), (127, -128, -43), -43, 1 / 170),
    # range [-1, 0.5]: the sum is negative -> zp = 127 - 85
    ((-1.0, 0.5), (-128, 127, 42), 42, 1 / 170),
    # all zero: m = 1, zp = 127 - 0
    ((0.0,), (127, 127, 127), 127, 1.0),
    # all positive: the minimum is taken as 0 -> zp = -128; 0.25·(255/0.5) = 127.5 -> 128
    ((0.5, 0.25), (127, 0, -128), -128, 0.5 / 255),
    # m = 1: ties round half away from zero (2.5 -> 3, -2.5 -> -3) before the zero point
    ((200.0, -55.0, 2.5, -2.5), (127, -128, -70, -76), -73, 1.0),
    # m = 255: zp = 127 - 127.5 = -0.5 rounds half to even -> 0; 0.5·255 = 127.5 -> 128 -> 127
    ((-0.5, 0.5, 0.25), (-128, 127, 64), 0, 1 / 255),
])
def test_activation_quantization_by_hand(values, codes, zero, scale):
    q, s, zp = quantize_activations(row(*values))
    assert q[0, :len(codes)].tolist() == list(codes)
    assert zp.item() == zero
    assert s.item() == pytest.approx(scale, rel=1e-6)


def test_w4_quantization_by_hand():
    w = torch.zeros(1, 256)
    w[0, :3] = torch.tensor([0.8, -0.4, 0.2])
    w[0, 128:130] = torch.tensor([-1.0, 1.0])
    codes, scales = quantize_w4(w)
    # group 0: the signed max 0.8 gives scale 0.8 / -8 = -0.1: codes -8, 4, -2
    assert codes[0, :3].tolist() == [-8, 4, -2]
    assert scales[0, 0].item() == torch.tensor(-0.1).bfloat16().item()
    # group 1: of two equal magnitudes the first decides; 1.0 / 0.125 = 8 clamps to 7
    assert codes[0, 128:130].tolist() == [-8, 7]
    assert scales[0, 1].item() == 0.125
    assert quantize_w4(row(0.0))[1].item() == 0.0  # an all-zero group keeps codes 0


def test_w4a8_output_by_hand():
    """(170·(-8) + (-85)·4) · bf16(-0.1) · (1/170) = -1700 · -0.10009765625 / 170."""
    head = quantize_head(row(0.8, -0.4), "w4a8")
    out = w4a8_reference(row(1.0, -0.5), head, torch.tensor([0]))
    assert out.item() == pytest.approx(1.0009765625, rel=1e-6)


def test_w8a8_output_by_hand():
    """Weights [0.25, -1.0] -> scale 1/127, codes [32, -127]; activations as above."""
    codes, scales = quantize_w8(row(0.25, -1.0))
    assert codes[0, :2].tolist() == [32, -127]
    head = QuantizedHead("w8a8", codes, scales, 128)
    out = project(row(1.0, -0.5), head, torch.tensor([0]), route="w8a8-torch").logits
    expected = (170 * 32 + 85 * 127) * scales.float().item() / 170
    assert out.item() == pytest.approx(expected, rel=1e-6)


def test_int4_packing_round_trips():
    codes = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 1)[:, :15]  # odd width
    packed = pack_int4(codes)
    assert packed.shape == (3, 8) and packed.dtype == torch.uint8
    assert packed[0, 0].item() == (0x8 | (0x9 << 4))  # -8 low nibble, -7 high nibble
    assert torch.equal(unpack_int4(packed, 15), codes)


# ---------------------------------------------------------------- reference properties

@pytest.mark.parametrize("shared", [False, True], ids=["per-row", "shared"])
@pytest.mark.parametrize("hidden", [576, 2560])
def test_w4a8_reference_matches_float64_of_its_integers(gen, shared, hidden):
    h, w, allowed = draw(gen, 4, hidden, 7, shared)
    result = project(h, w, allowed, route="w4a8-torch")
    assert result.route == "w4a8-torch"
    q, a_scale, zero = quantize_activations(h)
    codes, scales = quantize_w4(w)
    groups = scales.shape[1]
    pad = groups * 128 - hidden
    centered = torch.nn.functional.pad((q.long() - zero[:, None]).double(), (0, pad))
    dots = torch.einsum("bgc,vgc->bvg", centered.view(4, groups, 128),
                        torch.nn.functional.pad(codes.double(), (0, pad)).view(-1, groups, 128))
    full = (dots * scales.double()).sum(-1) * a_scale.double()[:, None]
    expected = full[:, allowed] if shared else full.gather(1, allowed)
    torch.testing.assert_close(result.logits.double(), expected, rtol=1e-5, atol=1e-5)
    dense = project(h, w, allowed).logits  # int4 error is large but bounded
    assert (result.logits - dense).abs().max() < 0.5


def test_ragged_last_group_is_zero_padding(gen):
    h, w, allowed = draw(gen, 3, 576, 5)
    pad = torch.nn.functional.pad
    a = project(h, w, allowed, route="w4a8-torch").logits
    b = project(pad(h, (0, 64)), pad(w, (0, 64)), allowed, route="w4a8-torch").logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("scheme", ["w4a8", "w8a8"])
def test_quantized_head_equals_on_the_fly_rows(gen, scheme):
    h, w, allowed = draw(gen, 4, 896, 32)
    head = quantize_head(w, scheme, chunk_rows=300)
    on_the_fly = project(h, w, allowed, route=f"{scheme}-torch")
    from_head = project(h, head, allowed)  # x86 host: the scheme's PyTorch route
    assert from_head.route == f"{scheme}-torch"
    assert torch.equal(from_head.logits, on_the_fly.logits)
    tolerance = 0.5 if scheme == "w4a8" else 0.05
    assert (from_head.logits - project(h, w, allowed).logits).abs().max() < tolerance


def test_quantized_head_is_refused_a_route_of_other_arithmetic(gen):
    h, w, allowed = draw(gen, 2, 256, 3)
    head = quantize_head(w, "w8a8")
    with pytest.raises(ValueError, match="w8a8 head cannot take route 'w4a8-torch'"):
        project(h, head, allowed, route="w4a8-torch")
    with pytest.raises(ValueError, match="w8a8 head cannot take route 'torch'"):
        project(h, head, allowed, route="torch")
    with pytest.raises(ValueError, match="codes must be"):
        QuantizedHead("w4a8", head.codes, head.scales, 256)


def test_option_sets_are_quantized_once(gen, monkeypatch):
    calls = []
    real = w4a8.quantize_head
    monkeypatch.setattr(w4a8, "quantize_head", lambda rows, scheme: calls.append(1) or
                        real(rows, scheme))
    h, w, allowed = draw(gen, 2, 256, 6)
    first = project(h, w, allowed, route="w4a8-torch").logits
    assert torch.equal(project(h, w, allowed.flip(1), route="w4a8-torch").logits, first.flip(1))
    assert len(calls) == 1  # same set of ids, other order: cached
    project(h, w, allowed[:, :3], route="w4a8-torch")
    assert len(calls) == 2  # another option set
    w.mul_(2)  # an in-place update bumps the tensor version
    project(h, w, allowed, route="w4a8-torch")
    assert len(calls) == 3
    copy = w.clone()
    project(h, copy, allowed, route="w4a8-torch")
    assert len(calls) == 4  # another head, same ids


# ---------------------------------------------------------------- route selection

@pytest.fixture
def host(monkeypatch):
    """A simulated host: set the machine, env vars and which flag_gems imports."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)

    def make(machine="aarch64", gems="ok", **env):
        monkeypatch.setattr(platform, "machine", lambda: machine)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if gems == "missing":
            monkeypatch.setitem(sys.modules, "flag_gems", None)
            monkeypatch.setitem(sys.modules, "flag_gems.quantized_linear", None)
            return None
        fake = FakeFlagGems(complete=gems == "ok")
        monkeypatch.setitem(sys.modules, "flag_gems", types.ModuleType("flag_gems"))
        monkeypatch.setitem(sys.modules, "flag_gems.quantized_linear", fake)
        return fake
    return make


class FakeFlagGems(types.ModuleType):
    """flag_gems.quantized_linear with its published contract, computing our reference."""

    def __init__(self, complete=True):
        super().__init__("flag_gems.quantized_linear")
        self.packed, self.pack_calls = {}, 0
        if complete:
            self.pack_rhs_qsi4c128p = self.pack
            self.w4a8_g128_linear = self.linear

    def pack(self, quantized, scales):
        n, k = quantized.shape
        assert quantized.dtype == torch.int8 and n % 4 == 0 and k % 128 == 0
        assert scales.shape == (n, k // 128) and scales.is_floating_point()
        assert -8 <= int(quantized.min()) and int(quantized.max()) <= 7
        self.pack_calls += 1
        blob = torch.zeros(n // 4 * (k // 128 * 264 + 16), dtype=torch.uint8)
        self.packed[blob.data_ptr()] = QuantizedHead("w4a8", pack_int4(quantized),
                                                     scales.bfloat16(), k)
        return blob

    def linear(self, x, packed, n, k):
        assert x.dtype == torch.bfloat16 and x.is_contiguous() and x.shape[-1] == k
        head = self.packed[packed.data_ptr()]
        assert head.vocab_size == n
        return w4a8_reference(x, head, torch.arange(n)).bfloat16()


def test_flagos_host_selects_flaggems(host):
    host(FLAGGEMS_VENDOR="arm")
    assert select_route("cpu") == "w4a8-flaggems"


def test_flagos_w8_head_selects_w8a8(host):
    host(FLAGGEMS_VENDOR="arm", FL_INT8_LMHEAD="1")
    assert select_route("cpu") == "w8a8-torch"


@pytest.mark.parametrize("choice,route", [("dense", "torch"), ("w8a8", "w8a8-torch"),
                                          ("w4a8", "w4a8-flaggems")])
def test_explicit_choice_overrides_the_host(host, choice, route):
    host(FLAGGEMS_VENDOR="arm", PCD_PROJECTION=choice)
    assert select_route("cpu") == route


@pytest.mark.parametrize("machine,env,route", [
    ("x86_64", {"FLAGGEMS_VENDOR": "arm"}, "torch"),
    ("aarch64", {}, "torch"),
    ("x86_64", {"PCD_PROJECTION": "w4a8"}, "w4a8-torch"),
])
def test_other_hosts_use_pytorch(host, machine, env, route):
    host(machine, **env)
    assert select_route("cpu") == route


def test_cuda_selects_triton(host):
    host("x86_64", "missing")
    assert select_route("cuda") == "triton"
    assert select_route("cuda", "w4a8") == "w4a8-triton"
    assert select_route("cuda", "w8a8") == "w8a8-torch"


@pytest.mark.parametrize("gems", ["missing", "incomplete"])
@pytest.mark.parametrize("choice,fallback", [(None, "torch"), ("w4a8", "w4a8-torch")])
def test_flaggems_that_cannot_run(host, monkeypatch, gems, choice, fallback):
    """Lenient only when FLAGGEMS_ARM_Q4_STRICT=0: unset is strict on a FlagOS host, as in
    FlagGems."""
    env = {"PCD_PROJECTION": choice} if choice else {}
    host(gems=gems, FLAGGEMS_VENDOR="arm", FLAGGEMS_ARM_Q4_STRICT="0", **env)
    with pytest.warns(UserWarning, match="cannot run"):
        assert select_route("cpu") == fallback
    for strict in ("1", "true", None):
        if strict is None:
            monkeypatch.delenv("FLAGGEMS_ARM_Q4_STRICT")
        else:
            monkeypatch.setenv("FLAGGEMS_ARM_Q4_STRICT", strict)
        with pytest.raises(RuntimeError, match="FLAGGEMS_ARM_Q4_STRICT strict mode"):
            select_route("cpu")


def test_strict_cuda_without_triton_raises(host, monkeypatch):
    host("x86_64", "missing", FLAGGEMS_ARM_Q4_STRICT="1")
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(RuntimeError, match="triton does not import"):
        select_route("cuda")
    with pytest.warns(UserWarning):
        assert select_route("cuda", strict=False) == "torch"


def test_bad_choices_are_refused(host, gen):
    host("x86_64", "missing", PCD_PROJECTION="int4")
    with pytest.raises(ValueError, match="scheme must be one of"):
        select_route("cpu")
    h, w, allowed = draw(gen, 2, 128, 2)
    with pytest.raises(ValueError, match="cannot run here"):
        project(h, w, allowed, route="w4a8-flaggems")


@pytest.mark.parametrize("hidden,k", [(576, 7), (896, 4), (2560, 1)])
def test_flaggems_route_on_fake_flaggems(host, gen, hidden, k):
    """N padded to a multiple of 4, H to one of 128, output sliced, packing cached."""
    fake = host(FLAGGEMS_VENDOR="arm")
    h, w, allowed = draw(gen, 3, hidden, k)
    result = project(h, w, allowed)
    assert result.route == "w4a8-flaggems"
    expected = project(h, w, allowed, route="w4a8-torch").logits
    assert torch.equal(result.logits, expected.bfloat16().float())
    project(h, w, allowed)
    assert fake.pack_calls == 1


@pytest.fixture
def engine_route():
    """vllm_pcd's cached route choice, cleared around the test (it caches per device)."""
    from vllm_pcd.internals import lm_head

    lm_head.projection_route.cache_clear()
    yield lm_head
    lm_head.projection_route.cache_clear()


@pytest.mark.parametrize("config,route", [
    (None, "w4a8-flaggems"), ({"projection": "w8a8"}, "w8a8-torch"),
    ({"projection": "dense"}, "torch")])
def test_restricted_head_route_follows_host_and_config(host, engine_route, config, route):
    """The engine's projection: the host's route unless additional_config.pcd chooses."""
    host(FLAGGEMS_VENDOR="arm")
    vllm_config = types.SimpleNamespace(additional_config={"pcd": config} if config else {})
    scheme = engine_route.configured_scheme(vllm_config)
    assert engine_route.projection_route(torch.device("cpu"), scheme) == route


def test_restricted_head_strict_route_fails_at_selection(host, engine_route):
    host(gems="missing", FLAGGEMS_VENDOR="arm", FLAGGEMS_ARM_Q4_STRICT="1")
    with pytest.raises(RuntimeError, match="FLAGGEMS_ARM_Q4_STRICT strict mode"):
        engine_route.projection_route(torch.device("cpu"), None)


# ---------------------------------------------------------------- real FlagGems (Arm only)

def _real_flaggems() -> str | None:
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return "FlagGems' W4A8-G128 kernel runs on AArch64 only"
    return w4a8.flaggems_problem()


@pytest.mark.skipif(_real_flaggems() is not None, reason=str(_real_flaggems()))
@pytest.mark.parametrize("batch,hidden,k", [(1, 576, 7), (5, 896, 32), (3, 2560, 2)])
def test_real_flaggems_matches_reference(gen, monkeypatch, batch, hidden, k):
    monkeypatch.setenv("FLAGGEMS_VENDOR", "arm")
    h, w, allowed = draw(gen, batch, hidden, k)
    got = project(h, w, allowed, route="w4a8-flaggems")
    expected = project(h, w, allowed, route="w4a8-torch").logits
    # BF16 output and the kernel's own float order (zero-point correction folded per tile).
    torch.testing.assert_close(got.logits, expected, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------- Triton, interpreted on CPU

@interpreted_only
def test_triton_interpret_activations_exact(gen):
    from vllm_pcd_kernels.triton_w4a8 import quantize_activations_triton
    rows = [row(1.0, -0.5, size=640), row(size=640), row(0.5, 0.25, size=640),
            row(200.0, -55.0, 2.5, -2.5, size=640), row(-0.5, 0.5, 0.25, size=640),
            torch.randn(4, 640, generator=gen), -torch.rand(1, 640, generator=gen)]
    x = torch.cat(rows)
    for got, want in zip(quantize_activations_triton(x), quantize_activations(x)):
        assert torch.equal(got, want)


@interpreted_only
@pytest.mark.parametrize("k", [1, 7, 256])
@pytest.mark.parametrize("batch,hidden", [(3, 576), (3, 896), (2, 2560)])
@pytest.mark.parametrize("shared", [False, True], ids=["per-row", "shared"])
def test_triton_interpret_w4a8_exact(gen, k, batch, hidden, shared):
    h, w, allowed = draw(gen, batch, hidden, k, shared)
    got = project(h, w, allowed, route="w4a8-triton")
    assert got.route == "w4a8-triton-interpret"
    assert torch.equal(got.logits, project(h, w, allowed, route="w4a8-torch").logits)


@pytest.mark.skipif(INTERPRETED, reason="this is the driver of the interpreted tests")
def test_triton_interpreted(request):
    """Run this file's interpreted tests where TRITON_INTERPRET=1 precedes `import triton`."""
    run_interpreted(request.path)
