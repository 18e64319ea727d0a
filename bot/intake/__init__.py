"""Webhook intake: verify, normalize and enqueue forge deliveries."""
