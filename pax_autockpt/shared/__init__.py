"""What every group shares: the event log, summaries, Pax and orbax internals, failures, loop phases, stops,
the coordination service, the manifest, the input's position and background threads' nice value.

May import only the top-level settings, layout and policies.
"""
