"""Training on top of the runtime: the distributed optimizer and gradient tape, the
fusion of small gradients, asynchronous training, gradient down-sampling and the
step-time check."""
