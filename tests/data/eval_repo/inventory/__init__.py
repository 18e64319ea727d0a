"""A tiny inventory service."""
