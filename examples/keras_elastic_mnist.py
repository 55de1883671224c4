"""Elastic Keras training (Horovod's elastic recipe): model.fit inside bps.elastic.run,
whose job may lose, gain or let go of workers while it trains.

    bpslaunch -np 2 --min-np 1 --max-np 4 python examples/keras_elastic_mnist.py
    bpslaunch --host-discovery-script ./hosts.sh --min-np 2 python examples/keras_elastic_mnist.py

After every change of the job, the epoch goes on from the last commit, each worker
takes its share of the data by the job's new size, and the learning rate follows the
size. A worker told to stop (SIGTERM) saves the model to --checkpoint as it leaves.
"""

import argparse

import digits_data
import keras

import tf_bps.keras as bps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05, help="per worker; scaled by size")
    parser.add_argument("--checkpoint", default="/tmp/keras_elastic_mnist.keras",
                        help="where a worker that is told to stop saves the model")
    args = parser.parse_args()

    bps.init()
    (x_train, y_train), (x_test, y_test), data = digits_data.load()
    model = keras.Sequential([
        keras.Input(x_train.shape[1:]),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(args.lr * bps.size(),
                                                              momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    state = bps.elastic.KerasState(model, batch=0, epoch=0)
    state.register_reset_callbacks([
        lambda: model.optimizer.learning_rate.assign(args.lr * bps.size())])

    callbacks = [bps.elastic.CommitStateCallback(state, batches_per_commit=5),
                 bps.elastic.UpdateBatchStateCallback(state),
                 bps.elastic.UpdateEpochStateCallback(state),
                 bps.elastic.PreemptionCheckpointCallback(args.checkpoint)]

    @bps.elastic.run
    def train(state):
        # Each worker's share of the data, by the job as it is now.
        x, y = x_train[bps.rank()::bps.size()], y_train[bps.rank()::bps.size()]
        if bps.rank() == 0:
            print(f"epoch {state.epoch}: {bps.size()} worker(s), {data}", flush=True)
        model.fit(x, y, batch_size=args.batch_size, initial_epoch=state.epoch,
                  epochs=args.epochs, callbacks=callbacks, verbose=0)

    train(state)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if bps.rank() == 0:
        print(f"{bps.size()} worker(s) at the end: test loss {loss:.4f}, "
              f"test accuracy {accuracy:.4f}")
    bps.shutdown()


if __name__ == "__main__":
    main()
