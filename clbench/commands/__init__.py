"""``run_bench.py`` sub-commands defined outside :mod:`clbench.cli`, one module per command; each registers itself
into :data:`clbench.registry.COMMANDS` (found by the registry's discovery of shipped modules):
:mod:`.pretrain` (``pretrain``) and :mod:`.forget` (``forget``)."""
