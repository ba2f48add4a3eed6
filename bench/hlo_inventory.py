"""What a compiled XLA program does, read from its optimized HLO text: its kernels, their matmul
FLOPs and bytes, and a roofline estimate of its time on a given device.

    from bench.hlo_inventory import kernel_inventory
    kernel_inventory(open("compiled_step.hlo.txt").read(), peak_flops=660e12, bytes_per_s=3.35e12)

The text is what `jax.stages.Compiled.as_text()` prints (bench/gpu_mfu.py writes it per side
with --profile_dir, or for a GPU that is not here with --aot_target_config). Each instruction
of the entry computation is one kernel, except the ones that move no data (parameters,
constants, tuples, bitcasts). A kernel's bytes are its operands' and its output's sizes, what it
would read and write if nothing stayed in cache; its FLOPs are 2 x output elements x contracted
size of every dot in it (a top-level dot, the dots of the fusion it calls, or the product a
cuBLAS custom call performs). The roofline estimate of a kernel is the larger of FLOPs / peak and
bytes / bandwidth, and the program's is their sum: a lower bound on its time that ignores launch
gaps, caches and tile quantisation. A while loop counts as one kernel whose body is read once
(its trip count is not in the text), so `while_loops` says where the counts are a lower bound.

Why by hand: XLA's own cost analysis (`Compiled.cost_analysis()`) returns nothing for a program
compiled without its device, and gives one total where this needs the kernels one by one.
"""

from __future__ import annotations

import re
from collections import defaultdict

# Bytes per element; sub-byte types count as one byte (rounded up, as they are stored).
_ELEMENT_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$")
_INSTRUCTION = re.compile(r"^(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
# Instructions that launch nothing: they name, pack or reinterpret buffers.
_NO_KERNEL = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all"}


def _shapes(text: str) -> list:
    """[(element type, [dims])] of every array shape in `text` (a tuple gives several)."""
    return [
        (t, [int(d) for d in dims.split(",") if d])
        for t, dims in _SHAPE.findall(text)
        if t in _ELEMENT_BYTES
    ]


def _bytes(text: str, first_only: bool = False) -> int:
    """Bytes of the shapes in `text`: all of them, or the first only."""
    shapes = _shapes(text)
    if first_only:
        shapes = shapes[:1]
    return sum(_ELEMENT_BYTES[t] * _elements(dims) for t, dims in shapes)


def _elements(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def parse_computations(hlo_text: str):
    """({computation name: [instruction dicts]}, entry name) from an HLO module's text. An
    instruction dict has name, type (its shape text), op, operands (names) and line."""
    computations, entry, current = {}, None, None
    for raw in hlo_text.splitlines():
        line = raw.strip()
        if not raw.startswith(" ") and line.endswith("{"):
            header = _HEADER.match(line)
            if header:
                current = header.group(2)
                computations[current] = []
                if header.group(1):
                    entry = current
                continue
        if line == "}":
            current = None
            continue
        if current is None:
            continue
        m = _INSTRUCTION.match(line)
        if m:
            name, shape, op, rest = m.groups()
            # Operands are the %names before the closing parenthesis of the operand list.
            operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
            computations[current].append(
                {"name": name, "type": shape, "op": op, "operands": operands, "line": line}
            )
    if entry is None:
        raise ValueError("HLO text: expected an ENTRY computation, found none")
    return computations, entry


def _contracted(line: str, lhs_dims) -> int:
    """The product of the lhs dimensions a dot (or a cuBLAS call) contracts."""
    m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", line)
    if not m:  # cuBLAS backend_config: "lhs_contracting_dimensions":["1"]
        m = re.search(r'"lhs_contracting_dimensions":\[([0-9",]*)\]', line)
    dims = [int(d) for d in (m.group(1).replace('"', "").split(",") if m else []) if d]
    return _elements(lhs_dims[d] for d in dims)


def _dot(instruction, types) -> dict:
    """FLOPs and a description of one dot (or cuBLAS gemm) instruction."""
    lhs, rhs = (types.get(o, "") for o in instruction["operands"][:2])
    lhs_shapes = _shapes(lhs)
    out_shapes = _shapes(instruction["type"])
    if not lhs_shapes or not out_shapes:
        return {"flops": 0, "dot": None}
    k = _contracted(instruction["line"], lhs_shapes[0][1])
    batch = re.search(r"lhs_batch_dims=\{([0-9,]*)\}", instruction["line"])
    out_type, out_dims = out_shapes[0]  # a cuBLAS call's result is (product, workspace)
    lhs_brief, rhs_brief = (t.split("{")[0].strip("(") for t in (lhs, rhs))  # without layouts
    described = f"{lhs_brief} x {rhs_brief} -> {out_type}[{','.join(map(str, out_dims))}]"
    if batch and batch.group(1):
        described += f" batch dims {{{batch.group(1)}}}"
    return {"flops": 2 * _elements(out_dims) * k, "dot": described}


def _dots_in(computations, name, seen=None) -> list:
    """Every dot reached from computation `name` through the fusions it calls."""
    seen = set() if seen is None else seen
    if name in seen or name not in computations:
        return []
    seen.add(name)
    types = {i["name"]: i["type"] for i in computations[name]}
    found = []
    for instruction in computations[name]:
        if instruction["op"] == "dot":
            found.append(_dot(instruction, types))
        called = re.search(r"calls=%([\w.\-]+)", instruction["line"])
        if called and instruction["op"] == "fusion":
            found += _dots_in(computations, called.group(1), seen)
    return found


def _category(instruction, dots) -> str:
    if instruction["op"] == "while":  # whatever its body holds
        return "while"
    line = instruction["line"]
    target = re.search(r'custom_call_target="([^"]+)"', line)
    if target:
        return "gemm (cuBLAS)" if "cublas" in target.group(1) else f"custom call {target.group(1)}"
    if dots:
        return "gemm (fusion)" if instruction["op"] == "fusion" else "gemm"
    backend_kind = re.search(r'"kind":"(\w+)"', line)
    if backend_kind:  # a GPU custom fusion, e.g. __triton (softmax-like rows)
        return f"fusion {backend_kind.group(1)}"
    kind = re.search(r"kind=(k\w+)", line)
    if kind:
        return {"kLoop": "elementwise (kLoop)", "kInput": "reduction (kInput)"}.get(
            kind.group(1), f"fusion {kind.group(1)}"
        )
    return instruction["op"]


def kernel_inventory(
    hlo_text: str, peak_flops: float = 0.0, bytes_per_s: float = 0.0, top_dots: int = 0
) -> dict:
    """The kernels of a compiled program (module docstring): totals, a per-category summary and
    the distinct dot shapes by their FLOPs (the first `top_dots` of them; all with 0). With
    peak_flops and bytes_per_s, the roofline estimate in seconds, per category and in all."""
    computations, entry = parse_computations(hlo_text)
    types = {i["name"]: i["type"] for i in computations[entry]}
    categories = defaultdict(lambda: {"kernels": 0, "flops": 0, "bytes": 0, "roofline_s": 0.0})
    dot_shapes = defaultdict(lambda: {"count": 0, "flops": 0})
    totals = {"kernels": 0, "flops": 0, "bytes": 0, "roofline_s": 0.0, "while_loops": 0}
    for instruction in computations[entry]:
        op = instruction["op"]
        if op in _NO_KERNEL:
            continue
        if op == "dot" or (op == "custom-call" and "cublas" in instruction["line"]):
            dots = [_dot(instruction, types)]
        else:
            called = re.search(r"(?:calls|body)=%([\w.\-]+)", instruction["line"])
            dots = _dots_in(computations, called.group(1)) if called else []
            totals["while_loops"] += op == "while"
        flops = sum(d["flops"] for d in dots)
        # A library call's result (cuBLAS, cuDNN) is (output, workspace): only the output counts.
        size = _bytes(instruction["type"], first_only=op == "custom-call") + sum(
            _bytes(types[o]) for o in dict.fromkeys(instruction["operands"]) if o in types
        )
        seconds = 0.0
        if peak_flops and bytes_per_s:
            seconds = max(flops / peak_flops, size / bytes_per_s)
        category = categories[_category(instruction, dots)]
        counts = {"kernels": 1, "flops": flops, "bytes": size, "roofline_s": seconds}
        for key, value in counts.items():
            category[key] += value
            totals[key] += value
        for d in dots:
            if d["dot"]:
                dot_shapes[d["dot"]]["count"] += 1
                dot_shapes[d["dot"]]["flops"] += d["flops"]
    ranked = sorted(dot_shapes.items(), key=lambda kv: -kv[1]["flops"])
    return {
        **totals,
        "categories": dict(sorted(categories.items(), key=lambda kv: -kv[1]["roofline_s"])),
        "dots": [{"shape": shape, **v} for shape, v in ranked[: top_dots or len(ranked)]],
    }
