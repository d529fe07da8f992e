"""No models: Shigoto's tables are its own (see `schema`). The module exists because Django
sends `post_migrate` only to apps that have one."""
