"""Compile the Gluon kernels for sm_90 in this process and print what the tests check, as JSON.

Run as a subprocess by tests/test_gluon_compile.py: the test session sets TRITON_INTERPRET=1, under which
Gluon functions cannot be compiled, so the compile happens here with the variable removed.
    python tests/gluon_sm90_probe.py '<json list of compile_sm90 keyword dicts>'
("kernel": "bwd" in a dict compiles the dK/dV kernel of kernels/gluon/dkdv.py instead of the forward of
kernels/gluon/fwd.py, "dq" the dQ kernel of kernels/gluon/dq.py.)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton  # noqa: E402

from kernels.gluon import dkdv, dq, fwd  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def exps_between_waits(sass):
    """MUFU.EX2 count between each 'wait until one MMA group is left' and the next full wait."""
    counts, inside, n = [], False, 0
    for line in sass.splitlines():
        if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1", line):
            inside, n = True, 0
        elif inside and re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", line):
            counts.append(n)
            inside = False
        elif inside and "MUFU.EX2" in line:
            n += 1
    return counts


def probe(cfg):
    cfg = dict(cfg)
    module = {"fwd": fwd, "bwd": dkdv, "dq": dq}[cfg.pop("kernel", "fwd")]
    try:
        kernel = module.compile_sm90(**cfg)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(kernel.asm["cubin"])
        fh.flush()
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", fh.name], capture_output=True, text=True,
                              check=True).stdout
    ptx = kernel.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".ptx", mode="w") as fh:
        fh.write(ptx)
        fh.flush()
        ptxas = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", fh.name, "-o", os.devnull],
                               capture_output=True, text=True)
    return {"wgmma_serialized": "serialized" in ptxas.stdout + ptxas.stderr, "shared": kernel.metadata.shared,
            "setmaxnreg": "setmaxnreg" in ptx,
            "wgmma": "wgmma.mma_async" in ptx, "hgmma": "HGMMA" in sass,
            "exps_between_waits": exps_between_waits(sass), "atomics": len(re.findall(r"\bATOMG?\.", sass)),
            "spill_stores": len(re.findall(r"\bSTL\b", sass)), "tma_reduces": len(re.findall(r"\bUTMAREDG\b", sass)),
            "tma_stores": len(re.findall(r"\bUTMASTG\b", sass)), "global_stores": len(re.findall(r"\bSTG\.", sass))}


if __name__ == "__main__":
    print(json.dumps([probe(cfg) for cfg in json.loads(sys.argv[1])]))
