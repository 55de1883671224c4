"""Keras model.fit with bps.DistributedOptimizer and the tf_bps callbacks.

    bpslaunch -np 2 python examples/keras_mnist_distributed_optimizer.py
    bpslaunch -np 2 python examples/keras_mnist_distributed_optimizer.py --powersgd-rank 2
    BYTEPS_MIN_COMPRESS_BYTES=4096 \
        bpslaunch -np 2 python examples/keras_mnist_distributed_optimizer.py --compressor topk
    python examples/keras_mnist_distributed_optimizer.py          # one process
"""

import argparse

import digits_data
import keras
import tensorflow as tf

import tf_bps as bps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--lr", type=float, default=0.01, help="per worker; scaled by size")
    parser.add_argument("--powersgd-rank", type=int, default=0,
                        help="send kernels' gradients as low-rank factors (PowerSGD) of this "
                             "rank after 10 whole steps; 0: whole throughout")
    parser.add_argument("--compressor", choices=["onebit", "topk", "randomk", "dithering"],
                        help="compress gradients with one of BytePS's compressors (error "
                             "feedback on); tensors below BYTEPS_MIN_COMPRESS_BYTES travel "
                             "whole")
    args = parser.parse_args()

    bps.init()
    (x_train, y_train), (x_test, y_test), data = digits_data.load()
    if bps.rank() == 0:
        print(f"{bps.size()} worker(s), {data}")
    # Each worker trains on its own slice of the data.
    x_train, y_train = x_train[bps.rank()::bps.size()], y_train[bps.rank()::bps.size()]

    keras.utils.set_random_seed(bps.rank())  # Different on purpose: the callback broadcasts.
    model = keras.Sequential([
        keras.Input(x_train.shape[1:]),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    # Horovod's recipe: scale the rate by the number of workers, warm it up.
    scaled_lr = args.lr * bps.size()
    compression = bps.Compression.none
    if args.powersgd_rank:
        compression = bps.Compression.powersgd(rank=args.powersgd_rank, start_iter=10)
    elif args.compressor:
        # BytePS's dict (compression_params) says the same: {"compressor": "topk", ...}.
        compression = bps.Compression.from_params({
            "compressor": args.compressor, "ef": "vanilla",
            **{"onebit": {"scaling": True}, "topk": {"k": 0.1}, "randomk": {"k": 0.1},
               "dithering": {"k": 8}}[args.compressor]})
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=0.9),
                                         compression=compression)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        bps.callbacks.BroadcastGlobalVariablesCallback(0),
        bps.callbacks.MetricAverageCallback(),
        bps.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1),
    ]
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=1 if bps.rank() == 0 else 0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    averaged = bps.push_pull(tf.constant([loss, accuracy]), name="final_metrics").numpy()
    if bps.rank() == 0:
        print(f"test loss {averaged[0]:.4f}, test accuracy {averaged[1]:.4f}")
    bps.shutdown()


if __name__ == "__main__":
    main()
