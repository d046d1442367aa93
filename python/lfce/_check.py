"""Checks of user arguments before they cross into C.

ctypes converts silently: an int too wide for its field wraps (``2**64 + 100`` becomes 100),
a string is cut at its first NUL, a bool passes as 1. Every public function of the package
runs its arguments through these first, so a bad value is a TypeError or ValueError that
names the argument and the value.
"""

import math
import numbers
import operator
import os

from .errors import ArgumentTypeError, InvalidArgumentError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def integer(name, value, *, minimum=INT64_MIN, maximum=INT64_MAX, allow_none=False):
    """``value`` as an int in [minimum, maximum]; bool, float and str are TypeErrors."""
    if value is None and allow_none:
        return None
    expected = "an int" + (" or None" if allow_none else "")
    if _is_bool(value):
        raise ArgumentTypeError(f"{name} must be {expected}, got the bool {value!r}")
    try:
        number = operator.index(value)  # ints and int-like scalars (numpy), never floats
    except TypeError:
        raise ArgumentTypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}") from None
    if not minimum <= number <= maximum:
        raise InvalidArgumentError(f"{name} must be in [{_bound(minimum)}, {_bound(maximum)}], got {number}")
    return number


def positive(name, value, *, maximum=INT64_MAX, allow_none=False):
    return integer(name, value, minimum=1, maximum=maximum, allow_none=allow_none)


def _bound(limit):
    for text, number in (("2**31 - 1", INT32_MAX), ("-2**31", INT32_MIN), ("2**63 - 1", INT64_MAX),
                         ("-2**63", INT64_MIN)):
        if limit == number:
            return text
    return str(limit)


_NUMPY_BOOL_NAMES = ("bool_", "bool")


def _is_bool(value):
    """A Python bool or a NumPy bool scalar (np.True_), which is not a numbers.Number."""
    if isinstance(value, bool):
        return True
    kind = type(value)
    return kind.__name__ in _NUMPY_BOOL_NAMES and kind.__module__ == "numpy"


def _number(name, value, what="a number"):
    """``value`` as a float (inf when too large for one): any real number, NumPy scalars included
    (np.float32, np.int64); bool, complex and str are TypeErrors."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def real(name, value, *, minimum):
    """``value`` as a finite float >= minimum; bool and str are TypeErrors."""
    number = _number(name, value)
    if not math.isfinite(number) or number < minimum:
        raise InvalidArgumentError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return number


FLOAT32_MIN_NORMAL = 2.0 ** -126  # the library takes the options as float32


def _option(name, value, none, inside, bounds):
    """A loss option: ``none`` for None, else ``value`` as a float for which ``inside`` holds.

    A non-zero value below float32's smallest normal number (1.18e-38) is refused: as a float32 it
    would be 0 (the option silently off) or a subnormal (NaN in the kernels' math)."""
    if value is None:
        return none
    number = _number(name, value, "None or a number")
    if not inside(number):  # NaN fails too
        raise InvalidArgumentError(f"{name} must be None or a number in {bounds}, got {value!r}")
    # (Every option's range is >= 0. The bound is written as a literal: torch.compile(dynamic=True)
    # treats a module-level float as an input and compiles again for each call.)
    if 0 < number < 1.1754943508222875e-38:  # FLOAT32_MIN_NORMAL
        raise InvalidArgumentError(f"{name} must be 0 or at least {FLOAT32_MIN_NORMAL:.6g} (float32's smallest normal "
                                   f"number; the library computes in float32, where {value!r} is 0 or subnormal), got "
                                   f"{value!r}")
    return number


def softcap(value):
    """A logit softcap: None (none) or a number in (0, 1e6], as a float."""
    return _option("softcap", value, None, lambda c: 0 < c <= 1e6, "(0, 1e6] (None: no cap)")


def temperature(value, name="temperature"):
    """A softmax temperature: None or 1 (none), or a number in [1e-6, 1e6], as a float."""
    return _option(name, value, 1.0, lambda t: 1e-6 <= t <= 1e6, "[1e-6, 1e6] (None or 1: none)")


def z_loss_scale(value, name="z_loss_scale"):
    """A z-loss scale: None or 0 (none), or a number in [0, 1e6], as a float."""
    return _option(name, value, 0.0, lambda s: 0 <= s <= 1e6, "[0, 1e6] (None or 0: none)")


def label_smoothing(value, name="label_smoothing"):
    """A label smoothing eps: None or 0 (none), or a number in [0, 1], as a float."""
    return _option(name, value, 0.0, lambda e: 0 <= e <= 1, "[0, 1] (None or 0: none)")


def flag(name, value):
    """``value`` as 0 or 1; only a bool (or a NumPy bool scalar) is accepted, so a string such as
    "no" is not True."""
    if not _is_bool(value):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return int(bool(value))


def text(name, value):
    """``value`` as UTF-8 bytes for a C string: a non-empty str without NUL characters."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty, got {value!r}")
    if "\0" in value:
        raise InvalidArgumentError(f"{name} must not contain a NUL character, got {value!r}")
    return value.encode()


def path(name, value):
    """``value`` (str, bytes or os.PathLike) as file-system bytes: non-empty, without NUL."""
    try:
        raw = os.fsencode(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a str, bytes or os.PathLike, got {type(value).__name__} {value!r}") from None
    if not raw:
        raise InvalidArgumentError(f"{name} must not be empty, got {value!r}")
    if b"\0" in raw:
        raise InvalidArgumentError(f"{name} must not contain a NUL character, got {value!r}")
    return raw


def choice(name, value, options):
    """``value`` if it is one of the str keys of ``options``."""
    if not isinstance(value, str) or value not in options:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value
