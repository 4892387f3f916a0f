"""pax-autockpt: preemption-tolerant Pax training (Cloud TPU Autocheckpoint, continuous checkpointing).

Kept import-light on purpose: `python -m pax_autockpt.main` must install its SIGTERM
handler before paxml, TensorFlow and JAX are imported (that takes ~7 s).
"""

__version__ = '0.1.0'
