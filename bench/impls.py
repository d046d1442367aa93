"""The implementations the harness runs side by side, their inputs, and what each needs in memory.

Each implementation is a forward (x, w, y) -> state and a backward (state, x, w) -> (grad_x, grad_w);
for a loss the state is the loss and the backward is autograd's. The anchors (Liger-Kernel, Cut
Cross-Entropy) are imported when asked for; one that cannot be imported raises Unavailable with the
reason, and the harness reports it as skipped.
"""

import atexit
import collections
import importlib
import os
import shutil
import sys
import tempfile
import zipfile

IGNORE_INDEX = -100
IGNORE_EVERY = 17  # one target in 17 ignored (5.9%), like padding in a packed batch
MIB = 1 << 20
LFCE_WORKSPACE = 256 * MIB  # the library's default backward workspace budget (the dzᵀ chunk)

DESCRIPTIONS = {
    "cublas_4gemm": "the floor: torch.matmul (cuBLAS) logits x·Wᵀ in the forward, then x·Wᵀ again, "
                    "dz·W and dzᵀ·x in the backward (the logits stand in for dz)",
    "cublas_3gemm": "the eager floor: x·Wᵀ in the forward, kept; dz·W and dzᵀ·x in the backward",
    "lfce_recompute": "lfce.linear_cross_entropy(mode='recompute')",
    "lfce_eager": "lfce.linear_cross_entropy(mode='eager')",
    "torch": "PyTorch naive: F.cross_entropy(F.linear(x, W), y), bf16 logits",
    "torch_compile": "torch.compile(dynamic=False) of the naive function, recompiled per shape",
    "liger": "Liger-Kernel liger_fused_linear_cross_entropy, default options (gradients in the forward)",
    "cce": "Cut Cross-Entropy linear_cross_entropy(impl='cce'), default gradient filtering (approximate)",
    "cce_exact": "Cut Cross-Entropy impl='cce_exact' where the version has it, else impl='cce', filter_eps=None "
                 "(no gradient filtering)",
}
FLOORS = ("cublas_4gemm", "cublas_3gemm")
IMPLEMENTATIONS = tuple(DESCRIPTIONS)

Impl = collections.namedtuple("Impl", "forward backward is_loss config")


class Unavailable(Exception):
    """An implementation cannot run in this process (not importable); the message says why."""


def add_wheels(folder):
    """Make the wheels in ``folder`` importable without pip: unpack each into one temporary
    directory (removed at exit) put last on sys.path. Returns the wheel file names.

    Unpacked rather than imported from the zip: Triton reads a kernel's source file.
    """
    try:
        wheels = sorted(name for name in os.listdir(folder) if name.endswith(".whl"))
    except OSError as error:
        raise ValueError(f"wheel folder {folder!r}: {error.strerror}") from None
    if not wheels:
        raise ValueError(f"wheel folder {folder!r} holds no .whl file")
    target = tempfile.mkdtemp(prefix="lfce-bench-wheels-")
    atexit.register(shutil.rmtree, target, True)
    for name in wheels:
        try:
            with zipfile.ZipFile(os.path.join(folder, name)) as wheel:
                wheel.extractall(target)
        except zipfile.BadZipFile:
            raise ValueError(f"wheel {os.path.join(folder, name)!r} is not a zip file") from None
    sys.path.append(target)  # last: a package installed on the machine wins over its wheel
    importlib.invalidate_caches()
    return wheels


def make_inputs(tokens, hidden, vocab, dtype, device="cuda", seed=0):
    """Random hidden ~ N(0, 1), weight ~ N(0, 2.5/sqrt(H)) (logits with std about 2.5), targets
    with every IGNORE_EVERY-th one ignored."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=device, generator=generator).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=generator) * (2.5 / hidden ** 0.5)).to(dtype)
    w.requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    y[torch.arange(tokens, device=device) % IGNORE_EVERY == IGNORE_EVERY - 1] = IGNORE_INDEX
    return x, w, y


def _torch_loss(x, w, y):
    import torch.nn.functional as F

    return F.cross_entropy(F.linear(x, w), y, ignore_index=IGNORE_INDEX)  # logits in x's dtype: the baseline


def _grads(loss, x, w):
    import torch

    return torch.autograd.grad(loss, (x, w))


def _loss(fn, config=None):
    return Impl(fn, _grads, True, config)


def _floor(count):
    """The matrix products of a fused step and nothing else; the 4-GEMM floor keeps nothing
    between forward and backward, the 3-GEMM floor keeps the logits."""
    def forward(x, w, y):
        z = x.detach() @ w.detach().t()
        return z if count == 3 else None

    def backward(z, x, w):
        x, w = x.detach(), w.detach()
        if z is None:
            z = x @ w.t()
        return z @ w, z.t() @ x
    return Impl(forward, backward, False, None)


def _import(module, what):
    try:
        return importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - any import failure (no Triton, old torch) means "skipped"
        raise Unavailable(f"{what} not importable ({module}): {type(error).__name__}: {error}") from None


def _liger():
    functional = _import("liger_kernel.transformers.functional", "Liger-Kernel")
    fn = functional.liger_fused_linear_cross_entropy
    return _loss(lambda x, w, y: fn(x, w, y, ignore_index=IGNORE_INDEX))


def _cce(exact):
    cce = _import("cut_cross_entropy", "Cut Cross-Entropy")
    known = {impl.name.lower() for impl in cce.LinearCrossEntropyImpl}
    if not exact:
        options = {"impl": "cce"}
    elif "cce_exact" in known:
        options = {"impl": "cce_exact"}
    else:  # releases before cce_exact (PyPI's 25.1.1): exact means no gradient filtering
        options = {"impl": "cce", "filter_eps": None}
    fn = cce.linear_cross_entropy
    return _loss(lambda x, w, y: fn(x, w, y, ignore_index=IGNORE_INDEX, **options),
                 ", ".join(f"{key}={value!r}" for key, value in options.items()))


def _torch_compile():
    import torch

    torch._dynamo.reset()  # a fresh cache for each shape: static kernels, and no recompile limit reached
    return _loss(torch.compile(_torch_loss, dynamic=False))


def load(name):
    """The implementation ``name`` (one of IMPLEMENTATIONS), ready for one shape; raises Unavailable."""
    if name in FLOORS:
        return _floor(int(name[len("cublas_")]))
    if name.startswith("lfce_"):
        from lfce.functional import linear_cross_entropy

        mode = name[len("lfce_"):]
        return _loss(lambda x, w, y: linear_cross_entropy(x, w, y, mode=mode))
    if name == "torch":
        return _loss(_torch_loss)
    if name == "torch_compile":
        return _torch_compile()
    if name == "liger":
        return _liger()
    if name in ("cce", "cce_exact"):
        return _cce(name == "cce_exact")
    raise ValueError(f"unknown implementation {name!r}; known: {', '.join(IMPLEMENTATIONS)}")


def _next_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def estimate_bytes(name, tokens, hidden, vocab, element_size=2):
    """An upper estimate of the device memory one forward + backward of ``name`` needs, inputs
    and gradients included: a combination above the free memory is skipped up front.

    ``name`` may also be "profile": the GEMM-only comparison's inputs, a [V, N] dzᵀ and lfce.
    """
    operands = (tokens + vocab) * hidden * element_size
    fixed = 2 * operands + 8 * tokens + 64 * MIB  # x, W, their gradients, targets, slack
    logits = tokens * vocab * element_size
    lfce = LFCE_WORKSPACE + 4 * tokens * hidden + 8 * MIB  # dzᵀ chunk, fp32 grad_x accumulator, partials
    chunk = _next_pow2(-(-tokens // -(-vocab // hidden)))  # Liger's token chunk: N / ceil(V/H), rounded up
    extra = {
        "cublas_4gemm": logits,
        "cublas_3gemm": logits,
        "lfce_recompute": lfce,
        "lfce_eager": lfce,
        "torch": 3 * logits,  # logits, log-softmax, their gradient
        "torch_compile": 2 * tokens * vocab * 4,  # fp32 intermediates at most
        "liger": 2 * chunk * vocab * 4 + 4 * (tokens + vocab) * hidden,
        "cce": 4 * vocab + 16 * tokens + 4 * (tokens + vocab) * hidden,
        "cce_exact": 4 * vocab + 16 * tokens + 4 * (tokens + vocab) * hidden,
        "profile": logits + lfce,
    }
    if name not in extra:
        raise ValueError(f"unknown implementation {name!r}; known: {', '.join(extra)}")
    return fixed + extra[name]


def fits(need, free, headroom=0.9):
    """Whether ``need`` bytes fit in ``free`` bytes, keeping 10% for the allocator's fragmentation."""
    return need <= headroom * free
