#!/usr/bin/env python3
"""Reproducer: flex · metamorphic:key_shift (fail)

InductorError: NoValidChoicesError: No choices to select. Provided reason: No choices exist for
backend. please consider adding ATEN into max_autotune_gemm_backends config (defined in
torch/_inductor/config.py) to allow at least one choice.

Check:    conformance/spec/test_metamorphic.py::test_metamorphic[flex-key_shift]
Problem:  Problem(seqlens_q=[0, 0, 0, 0, 0, 0, 59], seqlens_k=[0, 0, 0, 0, 0, 0, 59], heads_q=8, head_dim=16, dtype='float32', causal='none', length_law='uniform')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0775c4ab912c with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_metamorphic-flex-5be33f0fd1.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_metamorphic-flex-5be33f0fd1.py --backend reference  the same problem on another backend
    python test_metamorphic-flex-5be33f0fd1.py --device cuda:1      on another device

It reruns the check (test_metamorphic) on the problem as the run did and judges the result against
the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'flex',
 'device': 'cuda',
 'check': 'test_metamorphic',
 'params': {'relation': 'key_shift'},
 'problem': {'seqlens_q': [0, 0, 0, 0, 0, 0, 59],
             'seqlens_k': [0, 0, 0, 0, 0, 0, 59],
             'heads_q': 8,
             'heads_kv': 1,
             'head_dim': 16,
             'head_dim_v': None,
             'dtype': 'float32',
             'causal': 'none',
             'broadcast_q': False,
             'scale': None,
             'seed': 0,
             'length_law': 'uniform'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_metamorphic.py::test_metamorphic[flex-key_shift]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
