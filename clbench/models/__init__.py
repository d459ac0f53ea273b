"""Backbones registered in ``clbench.registry.MODELS``.

A model factory is called as ``MODELS.get(name)(info, **kwargs)`` with the scenario's
:class:`~clbench.protocol.ClassificationInfo` and returns an ``nn.Module``. Classifiers built by
:func:`clbench.models.classifier.build_classifier` expose ``.feature_extractor`` (x -> (B, D)) and ``.classifier``.
"""
