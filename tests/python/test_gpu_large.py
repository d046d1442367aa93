"""Problems whose element counts pass 2^31 (needs a CUDA GPU with about 30 GiB free).

Offsets into [N, V] or [N, H] buffers past 2^31 elements need 64-bit arithmetic in the
kernels; a 32-bit product wraps and reads or writes the wrong rows. The fp64 reference
runs token chunk by token chunk (checks.chunked_reference), so no [N, V] float64 tensor
is ever built.

* N·V: one backward chunk over the whole vocabulary (chunk_size = V), so the dzᵀ
  workspace itself holds N·V > 2^31 elements (4.3 GB); with bias, whose gradient reads
  dzᵀ rows at v·ld > 2^31 too.
* N·H: hidden, grad_hidden and the fp32 grad_hidden accumulator hold N·H > 2^31
  elements (the vocabulary takes several chunks at this N, so the accumulator is used).
"""

import pytest
import torch
from checks import GRAD, LOSS, assert_close, chunked_reference

import lfce

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
TWO_31 = 1 << 31


def inputs(n, h, v, bias, seed=0):
    """As checks.make_inputs (logit std about 2.5, every fifth token ignored), drawn in bf16
    directly so no float32 copy of a 4 GB hidden is made."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, device="cuda", generator=g, dtype=BF16)
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(BF16)
    b = (torch.randn(v, device="cuda", generator=g) * 0.5).to(BF16) if bias else None
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[4::5] = -100
    return x, w, b, y


def check_large(record, n, h, v, bias, tokens_per_chunk, **options):
    x, w, b, y = inputs(n, h, v, bias)
    grad = torch.tensor(1.25, device="cuda", dtype=BF16)
    leaves = [None if t is None else t.detach().requires_grad_() for t in (x, w, b)]
    loss = lfce.linear_cross_entropy(leaves[0], leaves[1], y, leaves[2], **options)
    loss.backward(grad)
    ours = [loss.detach()] + [None if t is None else t.grad for t in leaves]
    del loss
    torch.cuda.empty_cache()  # lfce's workspace, before the reference allocates
    ref = chunked_reference(x, w, b, y, "mean", grad, tokens_per_chunk=tokens_per_chunk,
                            grad_hidden_dtype=torch.float32)
    assert_close("loss (mean)", ours[0], ref[0], LOSS[BF16], record)
    for name, actual, expected in zip(("grad_hidden", "grad_weight", "grad_bias"), ours[1:], ref[1:]):
        if expected is not None:
            assert_close(name, actual, expected, GRAD[BF16], record)


def test_tokens_times_vocab_beyond_2_31(record_error):
    n, h, v = 16448, 256, 131072
    assert n * v > TWO_31
    check_large(record_error, n, h, v, True, 1024, chunk_size=v)


def test_tokens_times_hidden_beyond_2_31(record_error):
    n, h, v = 524352, 4096, 1024
    assert n * h > TWO_31
    check_large(record_error, n, h, v, False, 32768)
