"""Batch inference with a saved TensorFlow model over a Ray dataset.

The counterpart of TensorFlowOnSpark's ``cluster.inference``: a pool of Ray
actors each loads the model once, ``map_batches`` streams the dataset through
it, and every input row yields exactly one output row carrying its key columns
and the model's prediction, ready to be written as TFRecord or Parquet.

Example::

    import ray
    from ray_tfrecord import read_tfrecords
    from ray_tfrecord.tf import inference

    ds = read_tfrecords("/data/digits/test")
    inference(ds, "/models/digits.keras", "/data/digits/predictions",
              feature_columns="pixels", key_columns=["id"], output_format="parquet",
              checkpoint_path="/data/digits/predictions.checkpoint", min_rows_per_file=10_000)

With ``checkpoint_path`` (Ray 2.60's job checkpointing, keyed by the key column), a killed job run
again skips the keys already written and writes every key exactly once.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import ray
from ray.data import Dataset

from ray_tfrecord._src.core import options
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat, progress
from ray_tfrecord._src.data.write.datasink import SaveMode, TFRecordDatasink, write_prepared

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _keras_generation(model_path: str) -> int | None:
    """The Keras that wrote ``model_path``: 3 (Keras 3), 2 (tf-keras), None (a plain SavedModel).

    A ``.keras`` zip records its writer's ``keras_version`` in ``metadata.json`` (tf-keras
    writes ``2.x``); tf-keras writes HDF5 under that name inside a distribution strategy (what
    ``ReportCheckpoint`` saves under ``MultiWorkerMirroredStrategy``); ``.h5`` files and SavedModel
    directories with ``keras_metadata.pb`` are tf-keras formats.
    """
    if model_path.endswith(".keras") and os.path.isfile(model_path):
        with open(model_path, "rb") as f:
            if f.read(len(_HDF5_SIGNATURE)) == _HDF5_SIGNATURE:
                return 2
        try:
            with zipfile.ZipFile(model_path) as archive:
                version = str(json.loads(archive.read("metadata.json"))["keras_version"])
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            raise ValueError(
                f"{model_path}: not a Keras .keras file ({e}); pass a file saved with model.save(...keras) "
                "or a SavedModel directory"
            ) from e
        return 3 if int(version.split(".")[0]) >= 3 else 2
    if model_path.endswith((".keras", ".h5")) or os.path.exists(os.path.join(model_path, "keras_metadata.pb")):
        return 2
    return None


def _prediction_column(outputs: np.ndarray) -> pa.Array:
    """One Arrow value per row: a scalar, or the row's outputs flattened to a fixed-size list."""
    if outputs.dtype.kind == "f":
        # Keep TFRecord's float_list width; float64 would need explicit narrowing on write.
        outputs = outputs.astype(np.float32, copy=False)
    flat = np.ascontiguousarray(outputs).reshape(len(outputs), -1)
    if flat.shape[1] == 1:
        return pa.array(flat.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


class _Predictor:
    """Loads the model once per actor; maps an Arrow batch to keys + predictions."""

    def __init__(
        self,
        model_path: str,
        feature_columns: str | Sequence[str],
        key_columns: Sequence[str],
        output_column: str,
        defaults: Mapping[str, Any] | None,
    ) -> None:
        import tensorflow as tf

        from ray_tfrecord._src.tf.tensors import tensors_from_arrow

        self._to_tensors = tensors_from_arrow
        self._defaults = defaults
        self._feature_columns = feature_columns
        self._key_columns = list(key_columns)
        self._output_column = output_column
        keras = _keras_generation(model_path)
        if keras is not None:
            # Each Keras loads only its own files: tf-keras refuses Keras 3 configs, and Keras 3
            # does not rebuild every tf-keras model (ragged inputs, Lambda layers).
            if keras == 3:
                import keras as keras3

                model = keras3.saving.load_model(model_path, compile=False)
            else:
                import tf_keras

                model = tf_keras.models.load_model(model_path, compile=False)
            self._call = lambda inputs: model(inputs, training=False)
        else:
            signature = tf.saved_model.load(model_path).signatures["serving_default"]
            input_names = list(signature.structured_input_signature[1])
            outputs = list(signature.structured_outputs)
            if len(outputs) != 1:
                raise ValueError(f"{model_path}: serving signature has outputs {outputs}; expected one")

            def call(inputs):
                if not isinstance(inputs, dict):
                    if len(input_names) != 1:
                        raise ValueError(f"{model_path}: serving signature takes {input_names}; "
                                         "pass them as feature_columns=")
                    inputs = {input_names[0]: inputs}
                return signature(**inputs)[outputs[0]]

            self._call = call

    def __call__(self, batch: pa.Table) -> pa.Table:
        columns = self._feature_columns
        names = [columns] if isinstance(columns, str) else list(columns)
        tensors = self._to_tensors(batch, names, defaults=self._defaults)
        inputs = tensors[columns] if isinstance(columns, str) else tensors
        outputs = np.asarray(self._call(inputs))
        if len(outputs) != batch.num_rows:
            raise ValueError(f"model returned {len(outputs)} rows for a batch of {batch.num_rows}")
        keys = batch.select(self._key_columns)
        return keys.append_column(self._output_column, _prediction_column(outputs))


@public("ray_tfrecord.tf")
def predict(
    ds: Dataset,
    model_path: str | os.PathLike[str],
    *,
    feature_columns: str | Sequence[str],
    key_columns: Sequence[str],
    output_column: str = "prediction",
    defaults: Mapping[str, Any] | None = None,
    batch_size: int = 256,
    concurrency: int = 1,
    num_cpus: float | None = None,
    num_gpus: float = 0.0,
) -> Dataset:
    """Apply a saved model to every row of ``ds``; one output row per input row.

    Args:
        ds: Input rows, e.g. from ``ray_tfrecord.read_tfrecords``.
        model_path: A ``.keras`` file written by Keras 3 or by ``tf-keras``
            (each is loaded by the Keras its ``metadata.json`` names;
            [`MODEL_FILE`][ray_tfrecord.tf.MODEL_FILE] in a checkpoint is one), a
            tf-keras ``.h5`` file or Keras SavedModel directory, or any TensorFlow
            SavedModel with a single-output ``serving_default`` signature; a
            string or path-like.
        feature_columns: Model input column(s), converted as
            [`tf_dataset`][ray_tfrecord.tf.tf_dataset] does (one name: a tensor;
            several: a dict keyed by column, matching named model inputs).
        key_columns: Columns copied to the output so every prediction can be
            joined back to its input (at least one).
        output_column: Name of the prediction column: a scalar per row when
            the model gives one value per row, else a ``fixed_size_list`` of
            the row's outputs flattened (floats as float32).
        defaults: Values for null rows of feature columns (records without
            the feature), as in [`tf_dataset`][ray_tfrecord.tf.tf_dataset]; checked
            on the driver when the dataset's schema is known.
        batch_size: Rows per model call.
        concurrency: Number of model-holding actors.
        num_cpus: CPUs reserved per actor (fractions allowed). By default 1; on a
            cluster too small to hold that beside one read task (and Ray's checkpoint
            filter actor, on a checkpointed job's rerun) the most that fits, down to 0,
            and a log line says so. A job that cannot fit raises [`StallError`][ray_tfrecord.StallError]
            before it starts, naming the ``num_cpus`` that fits.
        num_gpus: GPUs reserved per actor.

    Returns:
        A lazy dataset with ``key_columns`` and ``output_column``.
    """
    _check_arguments(ds, feature_columns, key_columns, output_column, defaults)
    others = progress.checkpoint_holders(ds.context)
    predictors = _predictors("predict", concurrency, num_cpus, num_gpus, others)
    progress.preflight("predict", [predictors, *others], fix="predict(num_cpus={cpus})", zero_ok=True)
    return _predicted(ds, model_path, feature_columns=feature_columns, key_columns=key_columns,
                      output_column=output_column, defaults=defaults, batch_size=batch_size, concurrency=concurrency,
                      predictors=predictors)


def _predicted(ds: Dataset, model_path: str | os.PathLike[str], *, feature_columns: str | Sequence[str],
               key_columns: Sequence[str], output_column: str, defaults: Mapping[str, Any] | None, batch_size: int,
               concurrency: int, predictors: progress.Holder) -> Dataset:
    """``predict``'s dataset, its arguments checked and the cluster's room for ``predictors`` settled."""
    return ds.map_batches(
        _Predictor,
        fn_constructor_kwargs={
            "model_path": os.fspath(model_path),
            "feature_columns": feature_columns,
            "key_columns": list(key_columns),
            "output_column": output_column,
            "defaults": dict(defaults or {}),
        },
        batch_size=batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        **compat.actor_pool_args(concurrency),
        num_cpus=predictors.cpus,
        num_gpus=predictors.gpus,
    )


def _predictors(job: str, concurrency: int, num_cpus: float | None, num_gpus: float,
                others: list[progress.Holder]) -> progress.Holder:
    """The predictor actors: ``num_cpus`` each, or by default 1, or what fits beside ``others`` and
    one task on a small cluster."""
    holder = progress.Holder("predictor actors", concurrency, 1.0 if num_cpus is None else num_cpus, num_gpus)
    return holder if num_cpus is not None else progress.shrunk(job, holder, others, keyword="num_cpus")


def _check_arguments(ds: Dataset, feature_columns: str | Sequence[str], key_columns: Sequence[str],
                     output_column: str, defaults: Mapping[str, Any] | None) -> None:
    """``predict``'s arguments, refused before any actor starts: the keys, the output column, and bad
    ``defaults`` when the schema is known without reading."""
    if not key_columns:
        raise ValueError("key_columns must name at least one column to key the predictions by")
    if output_column in key_columns:
        raise ValueError(f"output_column {output_column!r} clashes with a key column")
    if not defaults:
        return
    from ray_tfrecord._src.tf.tensors import arrow_schema, column_plans

    schema = arrow_schema(ds.schema(fetch_if_missing=False))
    if schema is None:
        return
    column_plans(schema, [feature_columns] if isinstance(feature_columns, str) else list(feature_columns), defaults)


@public("ray_tfrecord.tf")
def inference(
    ds: Dataset,
    model_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    feature_columns: str | Sequence[str],
    key_columns: Sequence[str],
    output_format: Literal["tfrecord", "parquet"] = "tfrecord",
    mode: options.Mode = "error",
    output_column: str = "prediction",
    defaults: Mapping[str, Any] | None = None,
    batch_size: int = 256,
    concurrency: int = 1,
    num_cpus: float | None = None,
    num_gpus: float = 0.0,
    checkpoint_path: str | os.PathLike[str] | None = None,
    min_rows_per_file: int | None = None,
) -> None:
    """Run [`predict`][ray_tfrecord.tf.predict] and write the keyed predictions to ``output_path``.

    ``output_format="tfrecord"`` writes ``tf.train.Example`` records with
    [`write_tfrecords`][ray_tfrecord.write_tfrecords]; ``"parquet"`` uses Ray's Parquet
    writer.  ``mode`` says what to do when ``output_path`` (a string or path-like)
    already has data.

    ``checkpoint_path`` makes the job restartable (Ray 2.60's job checkpointing, with the one key
    column as the id, which must be unique): where a run was killed, running the same call again
    skips the keys already written, and each key is written exactly once. ``ds`` must start with a
    read (``read_tfrecords``, ``ray.data.read_parquet``, ...). ``mode`` applies to the first run of a
    checkpoint; its reruns add to what the earlier runs wrote. Ray deletes the checkpoint when the
    job succeeds. A location on storage every node sees (a path like ``output_path``).

    ``min_rows_per_file`` (both formats, as in ``write_tfrecords`` and ``write_parquet``): a write
    task gathers prediction batches until it holds at least this many rows and writes them to one
    file. Under ``checkpoint_path`` it is also the step in which Ray records progress (a write task's
    keys are recorded when it returns), so a killed job redoes at most about that many rows per
    running write task. Without it, ``"tfrecord"`` output gathers rows by size (up to 128 MiB a
    task: a small job is a single task, recorded only when it ends) and ``"parquet"`` writes a file
    per block of predictions, as Ray's writers do.
    """
    # What the job is, worked out once and passed down: its mode, whether it continues a checkpoint
    # (one listing of the checkpoint directory, a round trip on an object store), what it holds
    # (one check of the cluster), and one watchdog over all of it.
    mode = options.mode(mode)
    if output_format not in ("tfrecord", "parquet"):
        raise ValueError(f"output_format must be 'tfrecord' or 'parquet', got {output_format!r}")
    if min_rows_per_file is not None and min_rows_per_file <= 0:
        raise ValueError(f"min_rows_per_file must be positive, got {min_rows_per_file}")
    _check_arguments(ds, feature_columns, key_columns, output_column, defaults)
    config = None if checkpoint_path is None else _checkpoint_config(key_columns, os.fspath(checkpoint_path))
    rerun = config is not None and compat.checkpoint_started(config)
    others = [progress.CHECKPOINT_FILTER] if rerun else []
    predictors = _predictors("inference", concurrency, num_cpus, num_gpus, others)
    holders = [predictors, *others]
    fix = "inference(num_cpus={cpus})"
    progress.preflight("inference", holders, fix=fix, zero_ok=True)
    out = _predicted(ds, model_path, feature_columns=feature_columns, key_columns=key_columns,
                     output_column=output_column, defaults=defaults, batch_size=batch_size, concurrency=concurrency,
                     predictors=predictors)
    # The job's context is the input's (datasets derived from one share it): checkpointing is on for
    # this write only.
    context = out.context
    saved = getattr(context, "checkpoint_config", None)
    if config is not None:
        context.checkpoint_config = config
        if output_format == "parquet" and rerun:
            mode = "append"  # Ray's Parquet writer would apply mode again on a rerun, deleting or refusing
    try:
        with progress.Watchdog("inference", holders, waiting="its read and map tasks", fix=fix, zero_ok=True):
            if output_format == "parquet":
                out.write_parquet(os.fspath(output_path), mode=SaveMode(mode), min_rows_per_file=min_rows_per_file)
                return
            sink = TFRecordDatasink(output_path, mode=mode, min_rows_per_file=min_rows_per_file)
            if not sink.prepare(out, rerun=rerun):
                write_prepared(out, sink)
    finally:
        if config is not None:
            context.checkpoint_config = saved


def _checkpoint_config(key_columns: Sequence[str], checkpoint_path: str) -> Any:
    if len(key_columns) != 1:
        raise ValueError(f"checkpoint_path needs exactly one key column, Ray's id for a row; got key_columns="
                         f"{list(key_columns)}. Add one unique id column to the input and pass it alone")
    if not compat.CHECKPOINTS:
        raise ValueError(f"checkpoint_path needs Ray 2.60's job checkpointing; Ray {ray.__version__} has "
                         "none. Upgrade Ray, or leave checkpoint_path out")
    from ray.data.checkpoint import CheckpointConfig

    return CheckpointConfig(id_column=key_columns[0], checkpoint_path=checkpoint_path)
