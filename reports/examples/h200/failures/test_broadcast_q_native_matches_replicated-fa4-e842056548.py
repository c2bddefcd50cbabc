#!/usr/bin/env python3
"""Reproducer: fa4 · broadcast_q_native_matches_replicated (fail)

disagrees with the float64 oracle: dq 18x the allowance

Check:    conformance/spec/test_metamorphic.py::test_broadcast_q_native_matches_replicated[fa4]
Problem:  Problem(seqlens_q=[1, 1], seqlens_k=[0, 2], heads_q=4, heads_kv=2, head_dim=72, dtype='bfloat16', causal='none', broadcast_q=True, scale=1.0, length_law='uniform', offsets_dtype='int64')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0781d958d9cf with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_broadcast_q_native_matches_replicated-fa4-e842056548.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_broadcast_q_native_matches_replicated-fa4-e842056548.py --backend reference  the same problem on another backend
    python test_broadcast_q_native_matches_replicated-fa4-e842056548.py --device cuda:1      on another device

It reruns the check (test_broadcast_q_native_matches_replicated) on the problem as the run did and
judges the result against the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'fa4',
 'device': 'cuda',
 'check': 'test_broadcast_q_native_matches_replicated',
 'params': {},
 'problem': {'seqlens_q': [1, 1],
             'seqlens_k': [0, 2],
             'heads_q': 4,
             'heads_kv': 2,
             'head_dim': 72,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'none',
             'broadcast_q': True,
             'scale': 1.0,
             'seed': 0,
             'length_law': 'uniform',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_metamorphic.py::test_broadcast_q_native_matches_replicated[fa4]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
