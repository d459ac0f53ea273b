"""Analyses of trained models from what their training recorded (the dual form of linear layers: dual_form.py,
its pattern store: store.py, attention/attribution over training patterns: attribution.py, the ``analyze``
command: commands.py)."""
