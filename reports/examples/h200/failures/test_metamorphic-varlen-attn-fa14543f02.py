#!/usr/bin/env python3
"""Reproducer: varlen-attn · metamorphic:batch_split (fail)

RuntimeError: batch size must be positive

Check:    conformance/spec/test_metamorphic.py::test_metamorphic[varlen-attn-batch_split]
Problem:  Problem(seqlens_q=[0], seqlens_k=[0], head_dim=16, dtype='float16', causal='none', length_law='uniform')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0775c4ab912c with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_metamorphic-varlen-attn-fa14543f02.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_metamorphic-varlen-attn-fa14543f02.py --backend reference  the same problem on another backend
    python test_metamorphic-varlen-attn-fa14543f02.py --device cuda:1      on another device

It reruns the check (test_metamorphic) on the problem as the run did and judges the result against
the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'varlen-attn',
 'device': 'cuda',
 'check': 'test_metamorphic',
 'params': {'relation': 'batch_split'},
 'problem': {'seqlens_q': [0],
             'seqlens_k': [0],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 16,
             'head_dim_v': None,
             'dtype': 'float16',
             'causal': 'none',
             'broadcast_q': False,
             'scale': None,
             'seed': 0,
             'length_law': 'uniform'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_metamorphic.py::test_metamorphic[varlen-attn-batch_split]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
