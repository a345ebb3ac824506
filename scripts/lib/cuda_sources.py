"""What the scripts that compile kernel sources alone share (check-kernel-smem, kernel-code-size)."""
import os


def src_root_of(path):
    """The src/ directory enclosing `path` (kernel sources include "backends/...", "comm/..."),
    or, outside one, the directory two levels above `path`'s."""
    p = os.path.abspath(path)
    while os.path.dirname(p) != p:
        if os.path.basename(p) == "src":
            return p
        p = os.path.dirname(p)
    return os.path.abspath(os.path.join(path, "..", "..", ".."))
