"""The work a kernel does under the Triton interpreter, counted: the ``tl.dot`` calls
it executes (each goes through the interpreter builder's ``create_dot``). Counts are
exact where CPU time is not: on 2 shared cores the time of the same call drifts by
tens of percent with what the other core runs."""

from __future__ import annotations

from triton.runtime import interpreter


def count_dots(call) -> int:
    """How many ``tl.dot`` calls ``call()`` executes under the interpreter."""
    count = 0
    create_dot = interpreter.InterpreterBuilder.create_dot

    def counting(self, *args, **kwargs):
        nonlocal count
        count += 1
        return create_dot(self, *args, **kwargs)

    interpreter.InterpreterBuilder.create_dot = counting
    try:
        call()
    finally:
        interpreter.InterpreterBuilder.create_dot = create_dot
    return count
