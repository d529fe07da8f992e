"""The database layer: connections and pools, every runtime SQL statement, migrations, and the
embedded server for local runs. Nothing here imports the client, the runtime or the CLI."""
