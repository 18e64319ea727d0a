"""Monitoring: Prometheus metrics, wait alerts, the admin dashboard and SQL reports; reads only."""
