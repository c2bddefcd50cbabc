#!/usr/bin/env python3
"""Reproducer: flashinfer-fa2 · forward (fail)

disagrees with the float64 oracle: out inf (NaN or inf in the output) the allowance

Check:    conformance/spec/test_oracle_checks.py::test_forward[flashinfer-fa2]
Problem:  Problem(seqlens_q=[1], seqlens_k=[1], dtype='bfloat16', causal='none', length_law='pareto', offsets_layout='strided')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0781d958d9cf with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_forward-flashinfer-fa2-dc439433fd.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_forward-flashinfer-fa2-dc439433fd.py --backend reference  the same problem on another backend
    python test_forward-flashinfer-fa2-dc439433fd.py --device cuda:1      on another device

It reruns the check (test_forward) on the problem as the run did and judges the result against the
float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'flashinfer-fa2',
 'device': 'cuda',
 'check': 'test_forward',
 'params': {},
 'problem': {'seqlens_q': [1],
             'seqlens_k': [1],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 64,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'none',
             'broadcast_q': False,
             'scale': None,
             'seed': 0,
             'length_law': 'pareto',
             'offsets_dtype': 'int32',
             'layout': 'packed',
             'offsets_layout': 'strided',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_oracle_checks.py::test_forward[flashinfer-fa2]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
