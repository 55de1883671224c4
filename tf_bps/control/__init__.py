"""The control plane's programs: the scheduler that hands out ranks and addresses, and
the entry point of the native summation server."""
