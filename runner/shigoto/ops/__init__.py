"""Operating a queue: status, health, retry and cancel, the HTTP probes and Prometheus metrics.
These observe and steer the runtime; the runtime never imports them."""
