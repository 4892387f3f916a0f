"""Start-up: the environment and experiment checks before paxml loads, the start-up times, the standby hosts and
JAX's compilation cache.

May import local, signals, hosts and shared and the top-level settings, layout and policies; nothing above them.
"""
