"""HTTP frontend processes beside the engine (``--http-frontend-processes``): the protocol
work of the HTTP port on more cores, the scheduling still in one place (docs/architecture.md,
"Using more cores")."""
