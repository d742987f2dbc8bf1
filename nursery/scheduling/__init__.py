"""Pure scheduling policies: synchronous objects, no trio, no I/O, the clock passed in."""
