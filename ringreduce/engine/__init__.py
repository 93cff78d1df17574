"""The engine: the background thread per process set that negotiates, fuses and runs the ranks' requests."""
