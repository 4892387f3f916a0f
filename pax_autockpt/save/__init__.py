"""Saving to the job directory: which steps to save and keep, the save in the background, its costs and metrics.

May import startup, local, signals, hosts and shared and the top-level settings, layout and policies; never
restore (a sibling), the exit, the hook, the entry points or tools.
"""
