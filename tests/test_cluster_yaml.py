"""cluster.yaml: valid for Ray's cluster launcher, and shaped as the README promises."""

import json
import os
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_validates_against_rays_cluster_schema(config):
    schema_path = os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")
    with open(schema_path) as f:
        jsonschema.validate(config, json.load(f))
    # The path `ray up` takes before it contacts the cloud: defaults merged, then checked.
    validate_config(prepare_config(config))


def test_schema_check_is_not_vacuous(config):
    broken = {**config, "available_node_types": {**config["available_node_types"], "bad": {"node_config": {}}}}
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_cpu_head_cpu_readers_gpu_trainers(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert "--num-gpus=0" in " ".join(config["head_start_ray_commands"])
    readers = [t for name, t in types.items() if name != config["head_node_type"] and t["resources"].get("GPU", 0) == 0]
    trainers = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert readers and all(t.get("max_workers", 0) >= 1 for t in readers)
    assert trainers and all(t.get("max_workers", 0) >= 1 for t in trainers)
    assert all(t["labels"]["role"] == "trainer" for t in trainers)
    assert all(t["labels"]["role"] == "reader" for t in readers)
    assert all(t["docker"]["worker_image"].endswith("-gpu") for t in trainers)


def test_package_installed_on_every_node(config):
    prepared = prepare_config(config)
    mounts = prepared["file_mounts"]
    repo_on_node = next(remote for remote, local in mounts.items() if local == ".")
    install = f'pip install -q -e "{repo_on_node}[tf]"'
    # setup_commands are merged into both head and worker setup by the launcher.
    assert install in prepared["head_setup_commands"]
    assert install in prepared["worker_setup_commands"]
    for name, node_type in prepared["available_node_types"].items():
        if name != prepared["head_node_type"] and "worker_setup_commands" in node_type:
            assert install in node_type["worker_setup_commands"], name
    assert "**/*.so" in prepared["rsync_exclude"]
