"""Example workers for Shigoto on Kubernetes (see deploy/examples/)."""
