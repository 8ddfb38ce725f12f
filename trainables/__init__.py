"""Built-in trainables: generators ``train(config, data, ctx)`` (see :mod:`search.contract`).

One package per framework, imported only when a study names one of its trainables, so
importing this package imports no framework::

    knobs.py                  the knob names, defaults and choices both frameworks read
    fraction.py               subsample: the same ``train_fraction`` share in both
    torch/  common.py         setup(config, defaults, ctx) -> (cfg, torch.device), optimizer,
                              schedule, precision, early stopping, profiler
            data.py           load_data: arrays or image folder -> Tensors (scaled, subsampled)
            loop.py           fit_epochs: the epoch loop, checkpoints, the model handle
            export.py         the export hook (safetensors, checked ONNX)
            cnn.py rnn.py transfer.py        torch_cnn, torch_rnn, torch_transfer
    tf/     common.py         setup(config, defaults, ctx) -> (cfg, tf.distribute.Strategy),
                              model parts, optimizer, schedule
            data.py           load_data: arrays or image folder -> Splits (scaled, subsampled)
            loop.py           fit_epochs: one ``fit`` per epoch, checkpoints, the model handle
            export.py         the export hook (model.keras, SavedModel, model.onnx)
            devices.py        threads, GPU memory, replicas, MirroredStrategy
            cnn.py transfer.py               tf_cnn, tf_transfer

The twins are built the same way: ``cfg, device = setup(...)``, ``data = load_data(data, ctx,
train_fraction)`` (an image folder is read by :func:`search.materialize` for
both, so both see the same files, split and numbers), build the model, then
``return (yield from fit_epochs(model, data, cfg, ctx, device))``: the generator returns
``(model, data)`` after its last epoch, for the export hook (``train.exporter(make_exporter(
train))``). Each ``train`` declares its defaults and data-parallel mode with
:func:`search.trainable`.
"""
