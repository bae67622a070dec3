"""Alibaba Tablestore Tunnel backend (filled in by the backend work)."""
