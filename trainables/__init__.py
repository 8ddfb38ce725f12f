"""Built-in trainables: generators ``train(config, data, ctx)`` (see :mod:`search.contract`).

Each framework lives in its own modules (``torch_cnn``, ``torch_rnn``, ``torch_transfer``, ...),
imported only when a study names them, so importing this package imports no framework.
"""
