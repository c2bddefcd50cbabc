"""The Hopper (sm_90) kernels in Gluon: fwd.py, dkdv.py, dq.py, and what they share (pipeline.py)."""
