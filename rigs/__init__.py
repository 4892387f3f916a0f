"""The test and bench rigs, run from the repository's root (`python -m rigs.bench`, `python -m rigs.soak`): the local
GCS server, the fake metadata server, the soak driver, the decision simulator and the benchmarks. Not in the wheel.
"""
