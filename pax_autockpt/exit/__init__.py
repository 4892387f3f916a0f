"""The exit: from a signal's agreed step to the plan, the save, its commit and the exit; before the first step and
during the first compile; the rescue of a main thread held elsewhere; the eval and decode owed to the restart.

May import save, restore, startup, local, signals, hosts and shared and the top-level settings, layout and
policies; never the hook, the entry points or tools.
"""
