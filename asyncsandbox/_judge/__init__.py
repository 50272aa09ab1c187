"""The judge: the model, the engine and the runner behind :mod:`asyncsandbox.judge`."""
