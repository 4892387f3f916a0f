"""The hook Pax calls: the checkpointer Pax's train loop holds, its progress, and the goodput recording.

May import the exit, save, restore, startup, local, signals, hosts and shared packages and the top-level
settings, layout and policies; never the entry points (main, experiment, executor) or tools.
"""
