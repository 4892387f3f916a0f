"""The signal path: a signal or a maintenance notice -> the step every host agrees on and the time left, and the
console lines that never hold it.

May import hosts and shared and the top-level settings, layout and policies; nothing above them.
"""
