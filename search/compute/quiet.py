"""TensorFlow's start-up lines kept off the console of the command that trains in its own
process (``export``'s final model and hook, ``train``), and nothing else.

TensorFlow logs from C++ before its logging is set up (absl's "All log messages before
absl::InitializeLog() is called are written to STDERR"): ``TF_CPP_MIN_LOG_LEVEL`` does not
reach those lines, so a Keras export began with the oneDNN note, "Could not find cuda
drivers", the CPU-instructions note and, on a machine with CUDA's libraries but no GPU, an
``E0000 ... failed call to cuInit`` error. :func:`native_noise_filtered` sends file descriptor
2 through a pipe for the length of a block; a thread drops exactly those lines
(:data:`NOISE`) and writes every other byte on, at once, to the real stderr: the user's
warnings, their prints and TensorFlow's own later warnings all still show.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IW]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cpu_feature_guard|cuda_dnn|cuda_fft|cuda_blas)"
    rb"\.cc:\d+\] .*"
    rb"|E\d{4} [\d:.]+ +\d+ cuda_(platform|executor|diagnostics)\.cc:\d+\] .*cuInit.*"
    rb"|To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    rb"compiler flags\."
)
"""TensorFlow's start-up lines (a line is dropped when the whole of it matches)."""

STARTS = (b"WARNING: All log", b"I0", b"I1", b"W0", b"W1", b"E0", b"E1", b"To enable the")
"""How a line of :data:`NOISE` begins: any other line goes on before it ends."""

JOIN_S = 5.0
"""How long the end of a block waits for the last lines (a child process may hold the pipe)."""


def noise(line: bytes) -> bool:
    """Whether ``line`` (without its newline) is one of TensorFlow's start-up lines.

    Example:
        >>> noise(b"I0000 00:00:1796359835.781291   20667 cudart_stub.cc:31] Could not find cuda")
        True
        >>> noise(b"UserWarning: my own warning"), noise(b"E0000 00:00:1.2  7 my_op.cc:3] boom")
        (False, False)
    """
    return NOISE.fullmatch(line.rstrip(b"\r")) is not None


def _maybe_noise(start: bytes) -> bool:
    """Whether a line that begins ``start`` may still turn out to be noise."""
    return any(s.startswith(start[: len(s)]) for s in STARTS)


def _pump(source: int, target: int) -> None:
    """Copies ``source`` to ``target`` until end of file, dropping the lines of :data:`NOISE`;
    a line that cannot be one is written as it comes (a progress bar's ``\\r`` updates too)."""
    pending, passing = b"", False
    while chunk := os.read(source, 65536):
        pending += chunk
        out = []
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if passing or not noise(line):
                out.append(line + b"\n")
            passing = False
        if pending and (passing or not _maybe_noise(pending)):
            out.append(pending)
            pending, passing = b"", True
        if out:
            with contextlib.suppress(OSError):
                os.write(target, b"".join(out))
    if pending and (passing or not noise(pending)):
        with contextlib.suppress(OSError):
            os.write(target, pending)
    os.close(source)


@contextlib.contextmanager
def native_noise_filtered() -> Iterator[None]:
    """File descriptor 2 without TensorFlow's start-up lines for the length of the block
    (module docstring); as it was when it cannot be redirected."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, saved), name="search-stderr", daemon=True)
    pump.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer here: the pump reads to its end
        pump.join(JOIN_S)
        if not pump.is_alive():  # else a child still writes: the pump keeps its copy
            os.close(saved)
