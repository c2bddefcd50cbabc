"""What triton-jfa's warm-up compiles on an sm_90 GPU, and how long each compile takes, measured on any machine.

    python tools/compile_census.py [--profile ci] [--seed 0] [--json census.json]

First, under Triton's interpreter, the run's warm-up of triton-jfa for the profile's kernel configurations
records the compile key an sm_90 GPU would give each launch (tests/triton_keys.py). Then every recorded
variant is compiled for sm_90 with Triton's bundled ptxas, one at a time into an empty cache, and timed.
The table gives, per kernel, the variants, the compile seconds, and which arguments tell its variants apart.

What it leaves out: the Gluon kernels (the interpreter does not run them; kernels/gluon/*.py's
``compile_sm90`` compiles them one by one), bf16 (the interpreter's dot multiplies its raw bits, so the
CPU profile does not declare it; on a GPU each bf16 configuration adds the fp16 one's variants), and the
GPU machine's own CPU speed and Triton version. The counts are exact for what it covers; the seconds are
this machine's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import triton_keys  # noqa: E402


def record(profile: str, seed: int, path: str) -> None:
    """The keys of the warm-up's launches (run with TRITON_INTERPRET=1)."""
    triton_keys.dump(triton_keys.warm_keys(profile, seed), path)


def kernel_function(name: str):
    from kernels import schedule, tl
    for module in (tl, schedule):
        if hasattr(module, name):
            return getattr(module, name)
    raise KeyError(f"no Triton kernel {name} in kernels.tl or kernels.schedule")


def census(keys: dict) -> list[dict]:
    rows = []
    for key in sorted(keys, key=lambda k: (k[0], k[1])):
        start = time.perf_counter()
        compiled = triton_keys.compile_key(kernel_function(key[0]), key)
        target = re.search(r"^\.target (\w+)", compiled.asm["ptx"], re.M)
        rows.append({"kernel": key[0], "seconds": time.perf_counter() - start, "hash": compiled.hash,
                     "ptx_target": target.group(1) if target else None, "shared_bytes": compiled.metadata.shared,
                     "args": [list(a) for a in key[1]], "options": dict(key[2]), "configs": sorted(keys[key])})
    return rows


def varying(rows: list[dict]) -> list[str]:
    """The arguments whose specialisation differs between a kernel's variants."""
    seen = defaultdict(set)
    for row in rows:
        for name, *spec in row["args"]:
            seen[name].add("/".join(spec))
    names = defaultdict(list)  # arguments that vary together (a kernel's tensors by dtype) on one line
    for name, values in seen.items():
        if len(values) > 1:
            names[tuple(sorted(values))].append(name)
    return [f"{', '.join(group)} ({', '.join(values)})" for values, group in names.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", help="hypothesis profile whose kernel configurations to warm")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (which configurations are drawn)")
    parser.add_argument("--json", help="write every variant's key, configurations and seconds here")
    parser.add_argument("--keys", help="compile the keys saved in this file (tests/triton_keys.py: dump) instead "
                                       "of the warm-up's")
    parser.add_argument("--record", help=argparse.SUPPRESS)  # the interpreted half, in its own process
    ns = parser.parse_args(argv)
    if ns.record:
        record(ns.profile, ns.seed, ns.record)
        return 0
    why = triton_keys.available()
    if why:
        print(f"cannot read compile keys: {why}", file=sys.stderr)
        return 2
    if not triton_keys.has_ptxas():
        print("this Triton has no bundled ptxas: it cannot compile for sm_90 here", file=sys.stderr)
        return 2
    if ns.keys and not os.path.exists(ns.keys):
        print(f"--keys: no such file: {ns.keys}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        keys_path = ns.keys or os.path.join(tmp, "keys.json")
        if not ns.keys:
            env = {**os.environ, "TRITON_INTERPRET": "1", "JFA_CACHE_DIR": os.path.join(tmp, "jfa-cache")}
            subprocess.run([sys.executable, __file__, "--profile", ns.profile, "--seed", str(ns.seed),
                            "--record", keys_path], env=env, check=True)
        keys = triton_keys.load(keys_path)
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton-cache")  # every variant compiled afresh
        rows = census(keys)
    by_kernel = defaultdict(list)
    for row in rows:
        by_kernel[row["kernel"]].append(row)
    from rich.console import Console
    from rich.table import Table

    what = f"the keys in {ns.keys}" if ns.keys else f"triton-jfa warm-up, {ns.profile} profile, seed {ns.seed}"
    table = Table(title=f"{what}: Triton variants for sm_90")
    for column in ("kernel", "variants", "compile s", "s each", "variants differ in"):
        table.add_column(column, justify="right" if column in ("variants", "compile s", "s each") else "left")
    for kernel, krows in sorted(by_kernel.items(), key=lambda kv: -sum(r["seconds"] for r in kv[1])):
        seconds = sum(r["seconds"] for r in krows)
        table.add_row(kernel, str(len(krows)), f"{seconds:.1f}", f"{seconds / len(krows):.2f}",
                      "; ".join(varying(krows)))
    total = sum(r["seconds"] for r in rows)
    table.add_row("all", str(len(rows)), f"{total:.1f}", f"{total / max(1, len(rows)):.2f}", "", style="bold")
    Console(width=160).print(table)
    if ns.json:
        source = {"keys": ns.keys} if ns.keys else {"profile": ns.profile, "seed": ns.seed}
        Path(ns.json).write_text(json.dumps({**source, "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
