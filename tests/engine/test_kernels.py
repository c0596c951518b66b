"""Dense restricted projection: every route against a float64 reference, and input checks.

Inputs are fresh random draws each run; a failing test prints its seed. Triton tests (names
with "interpret") run in a subprocess with TRITON_INTERPRET=1 set before triton is imported,
so the interpreter does not leak into the rest of the session.
"""

import os

import pytest
import torch

from vllm_pcd_kernels import HeadRows, head_for_projection, project, snapshot_rows
from vllm_pcd_kernels.projection import gathered_matmul
from tests.conftest import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted_only = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 "
                                      "subprocess of test_triton_interpreted")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VOCAB = 1000


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")  # pytest shows it when the test fails
    return torch.Generator().manual_seed(seed)


def draw(gen, batch, hidden, k, dtype, shared, bias=False):
    """hidden, weight, allowed (with a repeated id), bias; logits come out O(1)."""
    h = torch.randn(batch, hidden, generator=gen)
    w = (torch.randn(VOCAB, hidden, generator=gen) / hidden ** 0.5).to(dtype)
    allowed = torch.randint(0, VOCAB, (k,) if shared else (batch, k), generator=gen)
    allowed[..., -1] = allowed[..., 0]
    b = torch.randn(VOCAB, generator=gen).to(dtype) if bias else None
    return h, w, allowed, b


def reference(h, w, allowed, bias=None):
    """float64: hidden cast to the weight dtype, exact products and sums."""
    full = h.to(w.dtype).double() @ w.double().T
    if bias is not None:
        full = full + bias.double()
    return full[:, allowed] if allowed.dim() == 1 else full.gather(1, allowed)


def check(result, h, w, allowed, bias, route):
    assert result.route == route
    assert result.logits.dtype == torch.float32
    assert result.logits.shape == (h.shape[0], allowed.shape[-1])
    # fp32 accumulation of O(1) terms over H <= 2560: far inside 1e-4.
    torch.testing.assert_close(result.logits.double(), reference(h, w, allowed, bias),
                               rtol=1e-4, atol=1e-4)


CASES = [(batch, hidden) for hidden, batch in ((576, 8), (896, 8), (2560, 3))]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 2, 7, 32, 256])
@pytest.mark.parametrize("batch,hidden", CASES)
@pytest.mark.parametrize("shared", [False, True], ids=["per-row", "shared"])
def test_torch_route(gen, dtype, k, batch, hidden, shared):
    h, w, allowed, bias = draw(gen, batch, hidden, k, dtype, shared, bias=k == 7)
    check(project(h, w, allowed, bias), h, w, allowed, bias, "torch")


@pytest.mark.parametrize("k", [2, 8, 32])
def test_per_row_strategies_agree(gen, k):
    """Rows sharing ids (one matmul onto their union) or not (product-sum per row)."""
    h, w, _, _ = draw(gen, 16, 576, k, torch.bfloat16, False)
    few = torch.randint(0, k, (16, k), generator=gen)  # union <= k
    many = torch.randint(0, VOCAB, (16, k), generator=gen)  # union > 8 k, in 1-2 chunks
    for allowed in (few, many):
        torch.testing.assert_close(gathered_matmul(h, w, allowed).double(),
                                   reference(h, w, allowed), rtol=1e-4, atol=1e-4)


def test_snapshot_rows_match_full_head(gen):
    h, w, allowed, bias = draw(gen, 4, 896, 7, torch.bfloat16, False, bias=True)
    snap = snapshot_rows(w, allowed.flatten().tolist() + [5, 6])
    assert isinstance(snap, HeadRows) and snap.rows.shape[0] <= 4 * 7 + 2
    check(project(h, snap, allowed, bias), h, w, allowed, bias, "torch")
    with pytest.raises(ValueError, match="not in the head snapshot"):
        absent = sorted(set(range(VOCAB)) - set(snap.ids.tolist()))[0]
        project(h, snap, torch.tensor([absent]))


def test_released_head_is_refused(gen):
    """An emptied head is never projected, and never silently replaced by the full head."""
    h, w, allowed, _ = draw(gen, 2, 576, 2, torch.bfloat16, True)
    released = torch.empty(0, dtype=torch.bfloat16)
    for call in (lambda: project(h, released, allowed), lambda: snapshot_rows(released, [1]),
                 lambda: head_for_projection(released)):
        with pytest.raises(ValueError, match="FLAGGEMS_RELEASE_BF16_LM_HEAD"):
            call()
    snap = snapshot_rows(w, allowed)
    assert head_for_projection(w, snap) is w
    assert head_for_projection(released, snap) is snap
    check(project(h, head_for_projection(released, snap), allowed), h, w, allowed, None, "torch")


@pytest.mark.parametrize("change,match", [
    (lambda h, w, a: (h, w, a.clone().fill_(VOCAB)), r"\[0, 1000\)"),
    (lambda h, w, a: (h, w, a.clone().fill_(-1)), r"\[0, 1000\)"),
    (lambda h, w, a: (h[:, :-1], w, a), "hidden size"),
    (lambda h, w, a: (h, w, a[:-1]), "rows but hidden has"),
    (lambda h, w, a: (h, w, a[:, :0]), "K >= 1"),
    (lambda h, w, a: (h, w, a[None]), r"\[K\] or \[B, K\]"),
    (lambda h, w, a: (h, w, a.float()), "integer tensor"),
    (lambda h, w, a: (h[0], w, a), r"float \[B, H\]"),
    (lambda h, w, a: (h, w[None], a), r"float \[V, H\]"),
])
def test_bad_inputs_are_refused(gen, change, match):
    h, w, allowed, _ = draw(gen, 3, 576, 4, torch.float32, False)
    with pytest.raises(ValueError, match=match):
        project(*change(h, w, allowed))


def test_bad_bias_and_routes_are_refused(gen, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    h, w, allowed, _ = draw(gen, 3, 576, 4, torch.float32, False)
    with pytest.raises(ValueError, match="bias must be"):
        project(h, w, allowed, torch.zeros(VOCAB - 1))
    with pytest.raises(ValueError, match="unknown route"):
        project(h, w, allowed, route="cuda")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        project(h, w, allowed, route="triton")


# ---------------------------------------------------------------- Triton, interpreted on CPU

@interpreted_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 7, 256])
@pytest.mark.parametrize("batch,hidden", [(3, 576), (2, 2560)])
@pytest.mark.parametrize("shared", [False, True], ids=["per-row", "shared"])
def test_triton_interpret_route(gen, dtype, k, batch, hidden, shared):
    h, w, allowed, bias = draw(gen, batch, hidden, k, dtype, shared, bias=k == 7)
    check(project(h, w, allowed, bias, route="triton"), h, w, allowed, bias, "triton-interpret")


@interpreted_only
def test_triton_interpret_odd_hidden_size(gen):
    h, w, allowed, _ = draw(gen, 2, 1000, 33, torch.bfloat16, False)  # ragged BLOCK_H and BLOCK_K
    check(project(h, w, allowed, route="triton"), h, w, allowed, None, "triton-interpret")


@pytest.mark.skipif(INTERPRETED, reason="this is the driver of the interpreted tests")
def test_triton_interpreted(request):
    """Run this file's interpreted tests where TRITON_INTERPRET=1 precedes `import triton`."""
    run_interpreted(request.path)
