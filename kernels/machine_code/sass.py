"""Read a kernel's SASS machine code without a GPU: the hot loop and what it is made of.

``kernels.flash.compile_check --report`` compiles a kernel ahead of time for
sm_90 or sm_80, then this module disassembles the cubin with the ``nvdisasm`` that
Triton bundles and finds the kernel's hot loop: the loop (a backward branch to a label)
that holds the tensor-core instructions, the innermost one if several do. It counts per
iteration of that loop

* all instructions, and tensor-core ones (``HGMMA`` on Hopper, ``HMMA`` before it);
* the softmax's floating point: ``FMUL``, ``FFMA``, ``FADD``, ``FMNMX`` and
  ``MUFU.EX2``;
* integer and address arithmetic (``IMAD``, ``IADD3``, ``LEA``, ``SHF``, ``LOP3``,
  ``ISETP``), and apart from it the uniform datapath's ``U*`` instructions;
* loads: ``LDGSTS`` (``cp.async``), ``UTMALDG`` (TMA), plain ``LDG``, ``LDS``/``LDSM``;
* fences: ``MEMBAR`` (``MEMBAR.ALL.GPU`` in an atomic path costs a round trip to L2).

Over the whole kernel it also records whether TMA and warp specialisation
(``USETMAXREG``: producer and consumer warpgroups re-balancing registers) are used.
These are instruction counts, not time: they say how much work an iteration issues, not
how well it overlaps. ``per_score`` puts tiles of different sizes and warp counts on one
scale: the instructions one thread issues per score element it computes.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import re
import subprocess
import tempfile

import triton

NVDISASM = (
    pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
)

_INSTR = re.compile(
    r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P[0-9T]+\s+)?"
    r"([A-Z][A-Z0-9_.]*)\s*(.*?);"
)
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")

TENSOR_CORE = ("HGMMA", "HMMA", "IMMA", "QGMMA")
#: Integer and address arithmetic on the vector datapath (per thread). The uniform
#: datapath's ``U*`` forms (one per warp, e.g. loop counters) are counted apart.
INTEGER = (
    "IMAD",
    "IADD3",
    "IADD",
    "LEA",
    "SHF",
    "LOP3",
    "ISETP",
    "IABS",
    "SEL",
    "IMNMX",
)


@dataclasses.dataclass
class Instr:
    address: int
    opcode: str  # with modifiers, e.g. "MUFU.EX2"
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def disassemble(cubin: bytes) -> tuple[list[Instr], dict[str, int]]:
    """Instructions of ``cubin`` in order, and each label's index into that list."""
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [str(NVDISASM), "-c", str(path)], capture_output=True, text=True, check=True
        ).stdout
    return parse(out)


def parse(text: str) -> tuple[list[Instr], dict[str, int]]:
    """``disassemble``'s parser, on ``nvdisasm -c`` text."""
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(instrs)
        elif m := _INSTR.match(line):
            instrs.append(Instr(int(m.group(1), 16), m.group(3), m.group(4)))
    return instrs, labels


def loops(instrs: list[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) instruction index of every loop: a branch back to an earlier
    label."""
    out = []
    for i, ins in enumerate(instrs):
        if ins.base == "BRA" and (m := _TARGET.search(ins.operands)):
            start = labels.get(m.group(1))
            if start is not None and start <= i:
                out.append((start, i))
    return out


def hot_loop(instrs: list[Instr], labels: dict[str, int]) -> tuple[int, int] | None:
    """The innermost loop that issues tensor-core instructions (None if no loop
    does)."""
    cands = [
        (a, b)
        for a, b in loops(instrs, labels)
        if any(ins.base in TENSOR_CORE for ins in instrs[a : b + 1])
    ]
    if not cands:  # CUDA-core dots (fp32, sm_75): the longest loop doing FFMA
        cands = [
            (a, b)
            for a, b in loops(instrs, labels)
            if any(ins.base == "FFMA" for ins in instrs[a : b + 1])
        ]
    return min(cands, key=lambda ab: ab[1] - ab[0]) if cands else None


def count(instrs: list[Instr]) -> dict[str, int]:
    """Instruction counts by the categories of the module docstring."""
    by = collections.Counter(ins.base for ins in instrs)
    full = collections.Counter(ins.opcode for ins in instrs)
    return {
        "instructions": len(instrs),
        "tensor_core": sum(by[k] for k in TENSOR_CORE),
        "FMUL": by["FMUL"],
        "FFMA": by["FFMA"],
        "FADD": by["FADD"],
        "FMNMX": by["FMNMX"],
        "MUFU.EX2": full["MUFU.EX2"],
        "integer": sum(by[k] for k in INTEGER),
        "uniform": sum(
            n for k, n in by.items() if k.startswith("U") and k not in TENSOR_CORE
        ),
        "LDGSTS": by["LDGSTS"],
        "UTMALDG": by["UTMALDG"],
        "LDG": by["LDG"],
        "LDS": by["LDS"] + by["LDSM"],
        "STG": by["STG"],
        "RED/ATOM": by["RED"] + by["ATOM"],
        "MEMBAR": by["MEMBAR"],
    }


def report(cubin: bytes) -> dict:
    """Counts for the hot loop (per iteration) and a few whole-kernel facts."""
    instrs, labels = disassemble(cubin)
    loop = hot_loop(instrs, labels)
    body = instrs[loop[0] : loop[1] + 1] if loop else []
    opcodes = {ins.opcode for ins in instrs}
    return {
        "hot_loop": count(body) if loop else None,
        "kernel_instructions": len(instrs),
        "tma": any(o.startswith(("UTMALDG", "UBLKCP")) for o in opcodes),
        "warp_specialized": any(o.startswith("USETMAXREG") for o in opcodes),
        "membar_gpu_in_loop": any(
            ins.opcode.startswith("MEMBAR") and "GPU" in ins.opcode for ins in body
        ),
    }


def per_score(instructions: float, block_m: int, block_n: int, num_warps: int) -> float:
    """Instructions one thread issues per score element it computes: a hot-loop count
    (per warp, per iteration) times ``32 * num_warps`` threads, over the
    ``block_m * block_n`` scores of the iteration's tile. Each thread of the
    ``num_warps`` warps that run the loop owns ``block_m * block_n / (32 * num_warps)``
    scores, so a tile of 8 warps and one of 4 warps doing the same work per thread get
    the same figure (one ``MUFU.EX2`` per score is about 1). In a warp-specialised
    kernel ``num_warps`` is the config's, one consumer warpgroup's (the producer warps
    run another loop)."""
    if min(block_m, block_n, num_warps) <= 0:
        raise ValueError(
            f"tile and warps must be positive, got {block_m}x{block_n} w{num_warps}"
        )
    return instructions * 32 * num_warps / (block_m * block_n)
