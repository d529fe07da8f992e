"""The runner process: the composition root (`runner`) and the services it starts — producers,
completer, notifier, elector, the leader's maintenance — plus how one job executes."""
