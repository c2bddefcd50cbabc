#!/usr/bin/env python3
"""Reproducer: varlen-attn · guarded_inputs (fail)

RuntimeError: unsupported operation: more than one element of the written-to tensor refers to a
single memory location. Please clone() the tensor before performing the operation.

Check:    conformance/spec/test_unwritten_memory.py::test_guarded_inputs[varlen-attn]
Problem:  Problem(seqlens_q=[1, 1], seqlens_k=[0, 0], dtype='bfloat16', causal='bottom_right', broadcast_q=True, length_law='uniform')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H100 80GB HBM3 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 18b2230e582d with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_guarded_inputs-varlen-attn-19d8ff3026.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_guarded_inputs-varlen-attn-19d8ff3026.py --backend reference  the same problem on another backend
    python test_guarded_inputs-varlen-attn-19d8ff3026.py --device cuda:1      on another device

It reruns the check (test_guarded_inputs) on the problem as the run did and judges the result
against the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'varlen-attn',
 'device': 'cuda',
 'check': 'test_guarded_inputs',
 'params': {},
 'problem': {'seqlens_q': [1, 1],
             'seqlens_k': [0, 0],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 64,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'bottom_right',
             'broadcast_q': True,
             'scale': None,
             'seed': 0,
             'length_law': 'uniform',
             'offsets_dtype': 'int32',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_unwritten_memory.py::test_guarded_inputs[varlen-attn]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
