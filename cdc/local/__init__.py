"""Local stand-ins for remote systems, shipped with the product for demos and tests (loopback only)."""
