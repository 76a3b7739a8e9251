"""Real multi-worker TensorFlow training on Ray Train, fed from TFRecord files."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import ray

import ray_tfrecord
from ray_tfrecord._src.tf.checkpoint import MODEL_FILE, ReportCheckpoint, restore
from ray_tfrecord._src.tf.train import tensorflow_trainer

pytestmark = pytest.mark.timeout(400)

SCHEMA = pa.schema([("x", pa.list_(pa.float32(), 2)), ("tokens", pa.list_(pa.int64())), ("y", pa.float32())])


def _write_rows(path: str, rows: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (rows, 2)).astype(np.float32)
    tokens = [rng.integers(0, 10, rng.integers(0, 5)).tolist() for _ in range(rows)]
    y = (2 * x[:, 0] - x[:, 1] + np.array([0.1 * len(t) for t in tokens])).astype(np.float32)
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 2),
            "tokens": pa.array(tokens, pa.list_(pa.int64())),
            "y": pa.array(y),
        }
    )
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table).repartition(5), path, max_rows_per_file=150)


def _build_model(tf):
    """Dense input plus a ragged one, so ragged batches go through MultiWorkerMirroredStrategy."""

    class RowLengths(tf.keras.layers.Layer):
        def call(self, ragged):
            return tf.expand_dims(tf.cast(ragged.row_lengths(), tf.float32), 1)

    x = tf.keras.Input((2,), name="x")
    tokens = tf.keras.Input((None,), dtype=tf.int64, ragged=True, name="tokens")
    bag = RowLengths()(tokens)
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()([x, bag]))
    model = tf.keras.Model({"x": x, "tokens": tokens}, out)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    return model


def _worker_setup(tf):
    """This worker's rank, the strategy (first, before other TF ops), the model and the shard."""
    rank = ray.train.get_context().get_world_rank()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _build_model(tf)
    return rank, strategy, model, ray.train.get_dataset_shard("train")


def _step_counter(tf, counts: list[int]):
    """A Keras callback appending each epoch's step count to ``counts``."""

    class StepCounter(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            counts.append(0)

        def on_train_batch_end(self, batch, logs=None):
            counts[-1] += 1

    return StepCounter()


def _equal_steps_loop(config):
    import tensorflow as tf

    from ray_tfrecord._src.tf.feed import tf_dataset

    rank, strategy, model, shard = _worker_setup(tf)
    feed = tf_dataset(shard, feature_columns=["x", "tokens"], label_columns="y", batch_size=config["batch_size"])
    # The feed reads the world size from Ray Train's context: a partial last batch is refused here.
    try:
        tf_dataset(shard, feature_columns="x", batch_size=config["batch_size"], drop_last=False)
        partial_refused = False
    except ValueError:
        partial_refused = True
    steps: list[int] = []
    history = model.fit(feed, epochs=config["epochs"], callbacks=[_step_counter(tf, steps), ReportCheckpoint()], verbose=0)
    log = {"steps": steps, "loss": history.history["loss"], "partial_refused": partial_refused,
           "tf_threads": [os.environ.get("TF_NUM_INTRAOP_THREADS"), os.environ.get("TF_NUM_INTEROP_THREADS")]}
    if "exact" in config:
        with strategy.scope():
            log["per_replica"] = _per_replica_passes(tf, strategy, _build_model(tf), config["exact"])
    with open(os.path.join(config["log_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(log, f)


def _per_replica_passes(tf, strategy, model, config) -> dict:
    """The ``exact`` shard through ``tf_dataset(strategy=)``: by hand for ``epochs`` (each replica's rows and
    batch sizes), then in ``fit``, then a plain pass; what each saw."""
    from ray_tfrecord._src.tf.feed import tf_dataset

    shard, steps = ray.train.get_dataset_shard("exact"), config["steps"]

    def feed():
        return tf_dataset(shard, feature_columns=["x", "tokens"], label_columns="y", batch_size=config["batch_size"],
                          steps_per_epoch=steps, strategy=strategy)

    seen, sizes, it = [], [], iter(feed())
    for _ in range(config["epochs"]):
        rows = []
        for _ in range(steps):
            features, label = next(it)
            (x,), (tokens,), (y,) = (strategy.experimental_local_results(t) for t in (features["x"], features["tokens"], label))
            sizes.append(int(y.shape[0]))
            rows += [[*map(float, xi), ti, float(yi)] for xi, ti, yi in zip(x.numpy(), tokens.to_list(), y.numpy())]
        seen.append(rows)
    del it
    counted: list[int] = []
    history = model.fit(feed(), epochs=config["epochs"], steps_per_epoch=steps, callbacks=[_step_counter(tf, counted)],
                        verbose=0)
    # The shard still serves whole epochs after the passes those feeds started and left.
    after = sum(int(y.shape[0]) for _, y in tf_dataset(shard, feature_columns="x", label_columns="y", batch_size=config["batch_size"]))
    return {"seen": seen, "sizes": sizes, "steps": counted, "loss": history.history["loss"], "after": after}


@pytest.mark.slow
def test_three_workers_take_equal_steps_and_per_replica_batches_read_each_row_once(ray_local, tmp_path):
    """One group of three: the plain feed over rows that do not divide into the workers' batches, then the
    per-replica feed (``strategy=``) over rows that do, each row once an epoch."""
    # Keras splits each element over the 3 replicas, so this is a per-replica batch of 16.
    rows, batch_size, workers, epochs = 1000, 48, 3, 3
    assert rows % (workers * batch_size) != 0
    exact = {"rows": 960, "batch_size": batch_size, "epochs": 2}
    exact["steps"] = (exact["rows"] // workers) // (batch_size // workers)
    _write_rows(str(tmp_path / "data"), rows)
    _write_rows(str(tmp_path / "exact"), exact["rows"])
    exact_ds = ray_tfrecord.read_tfrecords(str(tmp_path / "exact"), schema=SCHEMA)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    trainer = tensorflow_trainer(
        _equal_steps_loop,
        datasets={"train": ray_tfrecord.read_tfrecords(str(tmp_path / "data"), schema=SCHEMA), "exact": exact_ds},
        num_workers=workers,
        cpus_per_worker=0.25,
        train_loop_config={"batch_size": batch_size, "epochs": epochs, "log_dir": str(log_dir), "exact": exact},
        storage_path=str(tmp_path / "runs"),
    )
    result = trainer.fit()
    assert result.error is None
    assert result.metrics["epoch"] == epochs - 1
    logs = [json.loads((log_dir / f"rank{r}.json").read_text()) for r in range(workers)]
    # Each rank gets 333 rows -> 6 full elements of 48 -> 18 steps of 16 rows per replica.
    expected_steps = (rows // workers) // batch_size * workers
    assert [log["steps"] for log in logs] == [[expected_steps] * epochs] * workers
    assert all(log["partial_refused"] for log in logs)
    # A quarter-CPU worker runs TensorFlow on one thread per pool, not the machine's count.
    assert [log["tf_threads"] for log in logs] == [["1", "1"]] * workers
    # Training really happened, and every rank saw the same (all-reduced) model.
    assert logs[0]["loss"][-1] < logs[0]["loss"][0]
    assert os.path.exists(os.path.join(result.checkpoint.path, MODEL_FILE))

    replicas = [log["per_replica"] for log in logs]
    source = sorted([*map(float, r["x"]), r["tokens"], float(r["y"])] for r in exact_ds.take_all())
    for epoch in range(exact["epochs"]):
        assert sorted(row for log in replicas for row in log["seen"][epoch]) == source
    # Each replica's batch is the global batch's share: Keras does not cut it again.
    assert all(log["sizes"] == [batch_size // workers] * (exact["steps"] * exact["epochs"]) for log in replicas)
    assert [log["steps"] for log in replicas] == [[exact["steps"]] * exact["epochs"]] * workers
    assert replicas[0]["loss"][-1] < replicas[0]["loss"][0]
    assert [log["after"] for log in replicas] == [(exact["rows"] // workers) // batch_size * batch_size] * workers


def _resumable_loop(config):
    import tensorflow as tf

    from ray_tfrecord._src.tf.feed import tf_dataset

    rank = ray.train.get_context().get_world_rank()
    log_dir = config["log_dir"]

    def log(event):
        with open(os.path.join(log_dir, f"events{rank}.jsonl"), "a") as f:
            f.write(json.dumps(event) + "\n")

    def weight_sum(model):
        return float(sum(np.sum(w) for w in model.get_weights()))

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _build_model(tf)
    start = restore(model)
    log({"event": "start", "epoch": start, "weights": weight_sum(model), "pid": os.getpid()})

    class Trace(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            log({"event": "epoch_end", "epoch": epoch, "weights": weight_sum(self.model)})

        def on_train_batch_end(self, batch, logs=None):
            if rank == 1 and batch == 3 and self._epoch == config["kill_epoch"] and start == 0:
                # The controller registers a reported checkpoint when it next polls the
                # workers (every 2 s); give it time so the kill finds epoch 1's.
                time.sleep(6)
                # Tell the test which process to kill, then wait for it mid-epoch.
                with open(os.path.join(log_dir, "kill_me"), "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(120)

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

    feed = tf_dataset(ray.train.get_dataset_shard("train"), feature_columns=["x", "tokens"], label_columns="y", batch_size=32)
    # Trace first: the epoch's weights are logged before ReportCheckpoint saves them.
    model.fit(feed, epochs=config["epochs"], initial_epoch=start, callbacks=[Trace(), ReportCheckpoint()], verbose=0)


@pytest.mark.slow
def test_killed_worker_resumes_from_checkpoint(ray_local, tmp_path):
    _write_rows(str(tmp_path / "data"), 300)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    killed = []

    def killer():
        marker = log_dir / "kill_me"
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if marker.exists():
            time.sleep(0.2)  # let the pid be fully written
            pid = int(marker.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    trainer = tensorflow_trainer(
        _resumable_loop,
        datasets={"train": ray_tfrecord.read_tfrecords(str(tmp_path / "data"), schema=SCHEMA)},
        num_workers=2,
        cpus_per_worker=0.25,
        train_loop_config={"epochs": 4, "kill_epoch": 2, "log_dir": str(log_dir)},
        storage_path=str(tmp_path / "runs"),
        max_failures=1,
    )
    result = trainer.fit()
    thread.join(timeout=5)
    assert killed, "the worker never reached the kill point"
    assert result.error is None and result.metrics["epoch"] == 3

    events = [json.loads(line) for line in (log_dir / "events0.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    assert [s["epoch"] for s in starts] == [0, 2], "second attempt should resume after epoch 1's checkpoint"
    first_attempt_ends = {
        e["epoch"]: e["weights"] for e in events[: events.index(starts[1])] if e["event"] == "epoch_end"
    }
    assert sorted(first_attempt_ends) == [0, 1], "the kill should land mid-epoch 2"
    # The restarted workers hold exactly the weights checkpointed after epoch 1.
    assert starts[1]["weights"] == pytest.approx(first_attempt_ends[1], rel=1e-6)
    assert starts[1]["weights"] != pytest.approx(starts[0]["weights"], rel=1e-6)
    killed_rank = [json.loads(line) for line in (log_dir / "events1.jsonl").read_text().splitlines()]
    assert killed_rank[0]["pid"] == killed[0]
    assert [e["epoch"] for e in killed_rank if e["event"] == "start"] == [0, 2]


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_reservation_leaving_reads_no_cpu_fails_before_training(ray_local, tmp_path):
    """The README's old snippet on 2 CPUs (2 workers x 1 CPU) hung at Epoch 1; now it says what to change.

    The timeout bounds the run: if the check regressed, fit() would wait forever for a read CPU.
    """
    _write_rows(str(tmp_path / "data"), 64)
    ds = ray_tfrecord.read_tfrecords(str(tmp_path / "data"), schema=SCHEMA)
    assert ray.cluster_resources()["CPU"] == 2
    with pytest.raises(ray_tfrecord.StallError) as refused:
        tensorflow_trainer(
            _equal_steps_loop,
            datasets={"train": ds},
            num_workers=2,
            cpus_per_worker=1,
            train_loop_config={"batch_size": 8, "epochs": 1, "log_dir": str(tmp_path)},
            storage_path=str(tmp_path / "runs"),
        ).fit()
    assert str(refused.value) == (
        "tensorflow_trainer would wait forever: it needs 3 CPUs at once (training workers 2 x 1 CPU, one task 1 CPU) "
        "and the cluster has 2; pass tensorflow_trainer(cpus_per_worker=0.5) or ray.init(num_cpus=3) (or a cluster "
        "with that many CPUs)"
    )
    assert not (tmp_path / "runs").exists(), "nothing may start before the refusal"
    with pytest.raises(ray_tfrecord.StallError, match=r"needs 4 CPUs at once \(training workers 3 x 1 CPU.*pass "
                       r"tensorflow_trainer\(cpus_per_worker=0.33\) "):
        tensorflow_trainer(_equal_steps_loop, datasets={"train": ds}, num_workers=3, cpus_per_worker=1)


def test_one_cpu_cluster_is_told_to_grow(ray_local, monkeypatch):
    # A 1-CPU machine has no cpus_per_worker that leaves a read CPU: the message must not offer one.
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    with pytest.raises(ray_tfrecord.StallError, match=r"; pass ray.init\(num_cpus=2\) \(or a cluster with that many "
                       r"CPUs\)$"):
        tensorflow_trainer(_equal_steps_loop, datasets={"train": ray.data.range(4)}, num_workers=1)


def test_worker_env_sizes_tensorflow_threads_to_the_reservation_and_env_vars_win(ray_local, monkeypatch):
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    trainer = tensorflow_trainer(
        _equal_steps_loop, datasets={"train": ray.data.range(4)}, num_workers=2, cpus_per_worker=2.5,
        env_vars={"TF_NUM_INTEROP_THREADS": "4"},
    )
    env = trainer.run_config.worker_runtime_env["env_vars"]
    assert (env["TF_USE_LEGACY_KERAS"], env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("1", "2", "4")


def test_ray_trains_own_processes_unpickle_no_tensorflow(ray_local, monkeypatch):
    """Ray Train's controller and dataset manager unpickle the trainer's backend and dataset configs;
    when either one's module imported TensorFlow, so did both processes, on every fit(). The same holds
    for ps_trainer's actor classes, whose module the actors' processes import before TensorFlow's own."""
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    from ray_tfrecord._src.tf import parameter_servers

    trainer = tensorflow_trainer(_equal_steps_loop, datasets={"train": ray.data.range(4)}, num_workers=2)
    # A parameter-server cluster's actors, too: their processes unpickle the actor classes' module first.
    shipped = ray.cloudpickle.dumps([trainer.backend_config, trainer.data_config, trainer.run_config,
                                     parameter_servers._Task, parameter_servers._Chief])
    code = ("import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
            "print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", code], input=shipped, cwd=root, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.decode().splitlines()[-1] == "[]"
