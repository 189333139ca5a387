"""A tool module that does not import (``--tools`` must refuse it, ``tools_invalid``)."""

raise RuntimeError("this module is broken on purpose")
