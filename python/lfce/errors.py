"""The exceptions lfce raises, all catchable as :class:`LfceError`.

Split by whose fault it is, as the C library's status codes are:

* a bad argument from the caller: :class:`InvalidArgumentError` (a ``ValueError``) or
  :class:`ArgumentTypeError` (a ``TypeError``), naming the argument, the value and what is allowed;
  an option lfce does not implement: :class:`UnsupportedError` (a ``NotImplementedError``);
* the library cannot be used: :class:`LibraryError` (an ``OSError``: not found, or built for
  another version of this package);
* a problem, or a kernel of it, that needs more of a device resource than the device has (shared
  memory per block, CTAs or tiles in one launch): :class:`OutOfResources` (a ``ValueError``, as
  these were bad values before), with ``resource``, ``required`` and ``limit``;
* a toolchain failure: :class:`CompileError` (LLVM's or the driver JIT's log);
* a driver failure: :class:`CudaError` (the call, the code and its name);
* the kernel cache's files: :class:`CacheError` (an ``OSError``);
* a process group that is missing or unusable: :class:`ProcessGroupError` (a ``RuntimeError``);
* a call made where it cannot run (a first call inside CUDA graph capture, a second backward
  through an eager forward): :class:`UsageError` (a ``RuntimeError``);
* an lfce bug: :class:`InternalError`.

Each also derives from the built-in exception a caller would have caught before (ValueError,
TypeError, OSError, RuntimeError, NotImplementedError), so existing ``except`` clauses still work.
"""

__all__ = ["ArgumentTypeError", "CacheError", "CompileError", "CudaError", "InternalError", "InvalidArgumentError",
           "LfceError", "LibraryError", "OutOfResources", "ProcessGroupError", "UnsupportedError", "UsageError"]


class LfceError(Exception):
    """The base of every exception lfce raises on purpose."""


class InvalidArgumentError(LfceError, ValueError):
    """An argument's value is out of range or inconsistent with the others (the message names it)."""


class ArgumentTypeError(LfceError, TypeError):
    """An argument is of the wrong type (the message names it and the type given)."""


class UnsupportedError(LfceError, NotImplementedError):
    """An option or model lfce does not implement (the message names it and what to use instead)."""


class LibraryError(LfceError, OSError):
    """liblfce.so cannot be used: not found, or built for another version of this package."""


class OutOfResources(LfceError, ValueError):
    """The problem, or a kernel of it, needs more of a device resource than the device has.

    ``resource`` names it ("shared memory per block", "tiles in one launch", "CTAs along grid x"),
    ``required`` is what the problem needs and ``limit`` what the device (or the limit given for
    it) allows, in the resource's unit; the message says which value to change.
    """

    def __init__(self, message: str, *, required: int, limit: int, resource: str):
        super().__init__(message)
        self.required = required
        self.limit = limit
        self.resource = resource

    def __reduce__(self):  # picklable (a spawned worker can re-raise it), keywords included
        return _out_of_resources, (str(self), self.required, self.limit, self.resource)


def _out_of_resources(message, required, limit, resource):
    return OutOfResources(message, required=required, limit=limit, resource=resource)


class CompileError(LfceError, RuntimeError):
    """LLVM or the driver's PTX JIT failed; the message carries the log."""


class CudaError(LfceError, RuntimeError):
    """A CUDA driver call failed, or no driver/GPU is present."""


class CacheError(LfceError, OSError):
    """The kernel cache's files could not be read or written (the message names the path)."""


class ProcessGroupError(LfceError, RuntimeError):
    """lfce.distributed has no usable process group (the message says how to start one)."""


class UsageError(LfceError, RuntimeError):
    """A call made where it cannot run; the message says what to do first or instead."""


class InternalError(LfceError, RuntimeError):
    """An lfce bug: please report it with the message."""
