"""Loaded by every Python process whose path holds tests/workers, as the processes the
suite starts do (harness.base_env): their cyclic garbage collector runs full
collections a tenth as often. Importing TensorFlow allocates millions of objects that
live as long as the process, and the default thresholds scan them all again and again
while it imports: 0.5 s of the 3.3 s of CPU the import takes, paid by each of the suite's
TensorFlow processes on 2 cores. Cycles are still collected; nothing of tf_bps depends
on when."""

import gc

gc.set_threshold(700, 10, 100)
