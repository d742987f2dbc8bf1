"""Runtime machinery shared by the actors: supervision boundaries."""
