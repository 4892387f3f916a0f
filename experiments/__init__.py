"""Registered Pax experiments for pax-autockpt (``--exp=experiments.<module>.<Class>``)."""
