#!/usr/bin/env python3
"""Reproducer: fa4 · metamorphic:sequence_permutation (crash)

forward: CUDA error: an illegal memory access was encountered

Check:    conformance/spec/test_metamorphic.py::test_metamorphic[fa4-sequence_permutation]
Problem:  Problem(seqlens_q=[64, 64, 64, 64, 64, 64, 64, 64], seqlens_k=[0, 0, 40, 0, 0, 0, 0, 0], heads_q=6, heads_kv=2, head_dim=16, head_dim_v=128, dtype='float16', causal='none', broadcast_q=True, scale=1.0, length_law='observed')
          (the call in flight when the check's process died: the shapes and options are the ones
          that failed, the input values come from the problem's seed and may differ from the run's)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0775c4ab912c with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_metamorphic-fa4-dd61c09188.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_metamorphic-fa4-dd61c09188.py --backend reference  the same problem on another backend
    python test_metamorphic-fa4-dd61c09188.py --device cuda:1      on another device

It calls the backend once on the problem and judges the result against the float64 oracle;
CUDA_LAUNCH_BLOCKING=1 makes a device fault surface at the kernel launch that caused it.
"""
import os
import sys

REPRODUCER = {'backend': 'fa4',
 'device': 'cuda',
 'check': 'test_metamorphic',
 'params': {'relation': 'sequence_permutation'},
 'problem': {'seqlens_q': [64, 64, 64, 64, 64, 64, 64, 64],
             'seqlens_k': [0, 0, 40, 0, 0, 0, 0, 0],
             'heads_q': 6,
             'heads_kv': 2,
             'head_dim': 16,
             'head_dim_v': 128,
             'dtype': 'float16',
             'causal': 'none',
             'broadcast_q': True,
             'scale': 1.0,
             'seed': 0,
             'length_law': 'observed'},
 'mode': 'call',
 'gradients': False,
 'nodeid': 'conformance/spec/test_metamorphic.py::test_metamorphic[fa4-sequence_permutation]',
 'outcome': 'crash'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
