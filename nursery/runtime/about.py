"""What the server says of itself: its version (``nursery.__version__``, server metadata).

Kept here, apart from the package's ``__init__``, so that the modules that report it need not
import the package facade (which re-exports the in-process API)."""

VERSION = "0.1.0"
