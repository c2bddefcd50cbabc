"""Backends that misbehave on purpose (hang, crash, compile slowly, share builds), written to a module of
their own for each test that needs them: ``--backend <path>:<ClassName>``."""
from __future__ import annotations

import textwrap

import pytest

PLAIN = textwrap.dedent('''
    import os, time
    from conformance.reference import Reference
    from conformance.backend import Capabilities

    class Fine(Reference):
        name = "fine"

    class Hangs(Reference):
        name = "hangs"
        def forward(self, args):
            time.sleep(3600)

    class Segfaults(Reference):
        name = "segfaults"
        def forward(self, args):
            import ctypes
            ctypes.string_at(0)

    class Raises(Reference):
        name = "raises"
        def forward(self, args):
            raise ValueError("no kernel for this configuration")

    class CudaError(Reference):
        name = "cuda-error"
        def forward(self, args):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    class Aborts(Reference):
        name = "aborts"
        def forward(self, args):
            os.abort()

    class OutOfMemoryOnLong(Reference):
        """Runs out of device memory on causal problems of more than 100 rows (the CPU timings' causal shapes),
        as a padded layout does on a long sequence."""
        name = "oom-on-long"
        def forward(self, args):
            if args.causal == "bottom_right" and args.q.shape[0] > 100:
                import torch
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total "
                                             "capacity of 79.18 GiB of which 24.19 GiB is free. Including non-PyTorch "
                                             "memory, this process has 54.98 GiB memory in use.")
            return super().forward(args)

    NARROW = Capabilities(dtypes=("float32",), head_dims=(16,), causal_modes=("none",), gqa=False,
                          broadcast_q="none")

    class NarrowFine(Reference):
        name = "narrow-fine"
        capabilities = NARROW

    class NarrowRaises(Raises):
        name = "narrow-raises"
        capabilities = NARROW

    class HangsCompiling(Hangs):
        """Hangs in its warm-up (and in its checks), as a compiler that never returns."""
        name = "hangs-compiling"
        capabilities = Capabilities(dtypes=("float32",), head_dims=(16,), causal_modes=("none",), gqa=False,
                                    broadcast_q="none", compile_s=5.0)

    class TimedCompile(Reference):
        """Declares compiling; each warm-up call writes its configuration's head dim and causal mode to CALLS."""
        name = "timed-compile"
        capabilities = Capabilities(dtypes=("float32",), head_dims=(16, 64), causal_modes=("none", "bottom_right"),
                                    gqa=False, broadcast_q="none", compile_s=1.0)
        def forward(self, args):
            import sys
            if "--serve" in sys.argv:
                with open(os.environ["CALLS"], "a") as f:
                    f.write(f"{args.q.shape[-1]} {args.causal} {time.time()}\\n")
            return super().forward(args)

    _compiled = []

    class SlowCompile(Reference):
        """Its first call in a warm-up process takes COMPILE_S seconds; each warm-up call notes when it ended."""
        name = "slow-compile"
        capabilities = Capabilities(dtypes=("float32",), head_dims=(16,), causal_modes=("none",), gqa=False,
                                    broadcast_q="none", compile_s=5.0)
        def forward(self, args):
            import sys
            out = super().forward(args)
            if "--serve" in sys.argv:
                if not _compiled:
                    time.sleep(float(os.environ.get("COMPILE_S", "0")))
                    _compiled.append(True)
                with open(os.environ["WARM_ENDS"], "a") as f:
                    f.write(f"{time.time()}\\n")
            return out

    class SharedBuild(Reference):
        """Every configuration shares one build; each call notes its process and when it ran."""
        name = "shared-build"

        def build_key(self, config, device):
            return "one build"

        def forward(self, args):
            start = time.time()
            time.sleep(0.2)
            with open(os.environ["CALLS"], "a") as f:
                try:  # the scheduler group's niceness, where the kernel groups sessions (autogroup)
                    group = open("/proc/self/autogroup").read().split("nice")[-1].strip()
                except OSError:
                    group = "-"
                f.write(f"{os.getpid()} {start} {time.time()} {os.nice(0)} {args.q.shape[1]} {group} "
                        f"{os.environ.get('MAX_JOBS', '-')}\\n")
            return super().forward(args)
''')


@pytest.fixture
def misbehaving(tmp_path):
    path = tmp_path / "misbehaving.py"
    path.write_text(PLAIN)
    return path
