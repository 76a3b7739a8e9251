"""What a user's editor and type checker see of the public API, and the names tracebacks print.

No Ray starts here: the signatures refuse a wrong keyword before any work.
"""

import inspect
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

import pyarrow as pa
import pytest

import ray_tfrecord
import ray_tfrecord.tf
from ray_tfrecord.tf import ResumableFeed, inference, predict, tf_dataset

ROOT = Path(ray_tfrecord.__file__).parent.parent

# Type-check a user's script against the package alone: Ray, TensorFlow and Arrow have no stubs worth
# the minute their analysis costs, so their types read as Any.
MYPY_CONFIG = """\
[mypy]
strict = True
follow_imports = silent
[mypy-ray.*,tensorflow.*,tf_keras.*,keras.*,pyarrow.*,numpy.*]
follow_imports = skip
"""

USER_SCRIPT = """\
import ray_tfrecord
from ray_tfrecord.tf import tf_dataset

reveal_type(ray_tfrecord.read_tfrecords)
ds = ray_tfrecord.read_tfrecords("/data", columns=["x"], num_cpus=0.5)
ray_tfrecord.write_tfrecords(ds, "/out", mode="overwrite", memory=1e9)
feed = tf_dataset(ds, feature_columns="x", batch_size=2)
ray_tfrecord.read_tfrecords("/data", colums=["x"])
ray_tfrecord.write_tfrecords(ds, "/out", num_cpu=1)
tf_dataset(ds, features="x", batch_size=2)
"""


def test_mypy_strict_sees_the_real_signatures_and_refuses_a_misspelt_keyword(tmp_path):
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "mypy.ini", "user.py"],
                         cwd=tmp_path, env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    revealed = next(line for line in lines if "Revealed type" in line)
    assert 'Revealed type is "def (paths: str | os.PathLike' in revealed and "**task_options" in revealed, revealed
    errors = [line for line in lines if ": error:" in line]
    # Lines 5-7 are correct calls: no error there; each misspelling is one.
    assert sorted({int(line.split(":")[1]) for line in errors}) == [8, 9, 10], run.stdout
    assert 'Unexpected keyword argument "colums" for "read_tfrecords"; did you mean "columns"?' in errors[0]
    assert 'Unexpected keyword argument "num_cpu" for "write_tfrecords"; did you mean "num_cpus"' in errors[1]
    assert 'Unexpected keyword argument "features" for overloaded function "tf_dataset"' in errors[2]
    assert run.returncode == 1


@pytest.mark.parametrize("call", [
    lambda: tf_dataset(None, features="x", batch_size=2),
    lambda: tf_dataset(None, feature_columns="x", batch_size=2, drop_remainder=False),
    lambda: ResumableFeed(None, features="x", label_columns="y", batch_size=2),
    lambda: predict(None, "m", features="x", key_columns=["id"]),
    lambda: inference(None, "m", "out", features="x", key_columns=["id"]),
], ids=["tf_dataset-features", "tf_dataset-drop_remainder", "ResumableFeed", "predict", "inference"])
def test_the_names_before_ray_s_are_unknown_keywords(call):
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument '(features|drop_remainder)'"):
        call()


@pytest.mark.parametrize("function", [tf_dataset, ResumableFeed, predict, inference])
def test_feature_columns_is_required_and_keyword_only(function):
    parameter = inspect.signature(function).parameters["feature_columns"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is inspect.Parameter.empty


def test_an_unknown_ray_task_option_is_refused_at_run_time_too():
    with pytest.raises(TypeError, match=r"^read_tfrecords\(\) got an unexpected keyword argument 'num_cpu'$"):
        ray_tfrecord.read_tfrecords("/nowhere", num_cpu=1)


# A plan is pickled into read tasks that need not have TensorFlow: it keeps the module it is defined in.
_TF_NAMES_DEFINED_BELOW_TF = {"SplitPlan", "plan_splits"}


@pytest.mark.parametrize("namespace", [ray_tfrecord, ray_tfrecord.tf], ids=lambda m: m.__name__)
def test_public_objects_report_their_public_module(namespace):
    objects = {name: getattr(namespace, name) for name in namespace.__all__}
    own = {n: o for n, o in objects.items() if (inspect.isclass(o) or inspect.isfunction(o))
           and n not in _TF_NAMES_DEFINED_BELOW_TF and not o.__module__.startswith(("typing", "pyarrow"))}
    assert {n: o.__module__ for n, o in own.items()} == {n: namespace.__name__ for n in own}
    assert set(namespace.__all__) <= set(dir(namespace))
    for name, obj in own.items():
        assert pickle.loads(pickle.dumps(obj)) is obj, name


def test_a_traceback_names_the_public_exception():
    try:
        ray_tfrecord.decode_records(pa.array([b"\x0a\x05"], pa.binary()), pa.schema([("x", pa.int64())]))
    except ray_tfrecord.TFRecordError as e:
        last = traceback.format_exception_only(e)[-1]
    assert last.startswith("ray_tfrecord.DecodeError: "), last
    assert repr(ray_tfrecord.CorruptRecordError) == "<class 'ray_tfrecord.CorruptRecordError'>"
