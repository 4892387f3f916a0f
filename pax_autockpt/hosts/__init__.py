"""Host wiring: which host this is and how many there are, the agreement between hosts, and the device mesh.

May import shared and the top-level settings, layout and policies; nothing above them.
"""
