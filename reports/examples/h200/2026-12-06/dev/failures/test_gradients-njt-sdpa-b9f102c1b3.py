#!/usr/bin/env python3
"""Reproducer: njt-sdpa · gradients (fail)

disagrees with the float64 oracle: dq 1.4x the allowance

Check:    conformance/spec/test_oracle_checks.py::test_gradients[njt-sdpa]
Problem:  Problem(seqlens_q=[1, 1, 1, 1, 1, 1], seqlens_k=[4, 4, 3, 8, 3, 136], head_dim=72, dtype='bfloat16', causal='none', broadcast_q=True, scale=1.0, seed=2, length_law='bimodal', offsets_dtype='int64', grad_layout='expanded', values='outliers')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit ba8bbe1ade69

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_gradients-njt-sdpa-b9f102c1b3.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_gradients-njt-sdpa-b9f102c1b3.py --backend reference  the same problem on another backend
    python test_gradients-njt-sdpa-b9f102c1b3.py --device cuda:1      on another device

It reruns the check (test_gradients) on the problem as the run did and judges the result against the
float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'njt-sdpa',
 'device': 'cuda',
 'check': 'test_gradients',
 'params': {},
 'problem': {'seqlens_q': [1, 1, 1, 1, 1, 1],
             'seqlens_k': [4, 4, 3, 8, 3, 136],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 72,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'none',
             'broadcast_q': True,
             'scale': 1.0,
             'seed': 2,
             'length_law': 'bimodal',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'expanded',
             'values': 'outliers'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_oracle_checks.py::test_gradients[njt-sdpa]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
