"""The Shigoto Kubernetes operator: Queue and CronSchedule resources, reconciled by kopf.

Importing this package registers every handler (`kopf run -m shigoto_operator`).
"""
