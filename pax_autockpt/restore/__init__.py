"""The restore choice: which committed step a restart restores, and the integrity check of what it reads.

May import startup, local, signals, hosts and shared and the top-level settings, layout and policies; never
save (a sibling), the exit, the hook, the entry points or tools.
"""
