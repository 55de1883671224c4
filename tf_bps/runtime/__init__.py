"""The runtime of a worker process: its configuration (read once, from the environment),
the native engine's binding, joining the job (init, rank, size, process sets) and the
TensorFlow collectives. Nothing here imports the training code, the control plane's
programs or the launcher."""
