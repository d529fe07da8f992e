"""A one-model shop: placing an order enqueues its confirmation email in the same transaction."""
