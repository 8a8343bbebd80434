"""Status arithmetic: phases, conditions and pod counts. Pure functions."""
