"""The Shigoto Kubernetes operator: Queue and CronSchedule resources, reconciled by kopf.

Importing this package registers every handler (`kopf run -m shigoto_operator`).
"""

import importlib.util

# The pure modules (crds, spec, builders, policy, status) must stay importable where kopf is
# not installed (rendering the CRDs, a plain `shigoto` install). Where kopf is installed, the
# import is unguarded, so a broken handler module fails loudly instead of registering nothing.
if importlib.util.find_spec("kopf") is not None:
    from shigoto_operator import handlers as handlers
