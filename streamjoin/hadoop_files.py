"""Small files on a Hadoop file system other than a local folder (`s3a://`, `abfss://`, `gs://`,
`hdfs://`): what `atomic` does for local folders, through the session's Hadoop FileSystem.

A file is replaced the way Spark writes its own streaming checkpoint files on that store (its
`CheckpointFileManager`: written whole, readers see the old content or the new). A file that must
not exist yet is created with Hadoop's create-if-absent (`overwrite(false)`, and on S3 the
conditional PUT Hadoop's S3A connector sends with `If-None-Match`), so two writers cannot both
create it; with an entity tag, a file is replaced only while it still holds what was read
(`If-Match`). docs/scale-out.md says what each store guarantees.
"""

from __future__ import annotations

from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.sql import SparkSession

from streamjoin.errors import SetupError

# Hadoop's builder options for a conditional create (honoured by S3A; other stores make a create
# without overwrite exclusive themselves).
_IF_ABSENT = "fs.option.create.conditional.overwrite"
_IF_TAG = "fs.option.create.conditional.overwrite.etag"
_EXISTS = ("FileAlreadyExistsException", "RemoteFileChangedException", "PathExistsException")


def is_remote(location: object) -> bool:
    """A URL of a file system other than the local one (which `atomic` writes itself)."""
    text = str(location)
    return "://" in text and not text.startswith("file:")


def _open(location: str) -> tuple[Any, Any, Any]:
    """The Hadoop FileSystem, Path and configuration for `location`, from the active session."""
    spark = SparkSession.getActiveSession()
    if spark is None:
        raise SetupError(f"{location} is on a Hadoop file system, which needs a Spark session to reach")
    jvm, conf = spark.sparkContext._jvm, spark.sparkContext._jsc.hadoopConfiguration()
    assert jvm is not None  # a classic session's driver
    path = jvm.org.apache.hadoop.fs.Path(location)
    return path.getFileSystem(conf), path, conf


def _java_error(error: Py4JJavaError) -> str:
    return error.java_exception.getClass().getSimpleName()


def read_text(location: str) -> str:
    """The file's text; FileNotFoundError when there is none."""
    fs, path, _ = _open(location)
    try:
        stream = fs.open(path)
    except Py4JJavaError as error:
        if _java_error(error) == "FileNotFoundException":
            raise FileNotFoundError(location) from None
        raise
    try:
        spark = SparkSession.getActiveSession()
        assert spark is not None and spark.sparkContext._jvm is not None
        data = spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode("utf-8")


def stat(location: str) -> tuple[float, str | None] | None:
    """When the file was last written (seconds since the epoch) and its entity tag where the store
    keeps one (S3); None without the file."""
    fs, path, _ = _open(location)
    try:
        status = fs.getFileStatus(path)
    except Py4JJavaError as error:
        if _java_error(error) == "FileNotFoundException":
            return None
        raise
    try:
        entity_tag = status.getEtag()
    except Py4JError:  # a status class without entity tags
        entity_tag = None
    return status.getModificationTime() / 1000, entity_tag


def exists(location: str) -> bool:
    fs, path, _ = _open(location)
    return bool(fs.exists(path))


def names(folder: str) -> list[str]:
    """The names of the entries directly in `folder`; none when it does not exist."""
    fs, path, _ = _open(folder)
    try:
        return [status.getPath().getName() for status in fs.listStatus(path)]
    except Py4JJavaError as error:
        if _java_error(error) == "FileNotFoundException":
            return []
        raise


def replace(location: str, data: bytes) -> None:
    """Write `data` to `location` whole, replacing what it held, as Spark writes its checkpoint files."""
    fs, path, conf = _open(location)
    spark = SparkSession.getActiveSession()
    assert spark is not None and spark.sparkContext._jvm is not None
    managers = spark.sparkContext._jvm.org.apache.spark.sql.execution.streaming.checkpointing
    manager = managers.CheckpointFileManager.create(path.getParent(), conf)
    manager.mkdirs(path.getParent())  # its temporary file goes beside the file, in a folder that exists
    stream = manager.createAtomic(path, True)
    try:
        stream.write(bytearray(data))
    except BaseException:
        stream.cancel()
        raise
    stream.close()


def create(location: str, data: bytes, replacing_tag: str | None = None) -> None:
    """Create `location` holding `data`, or FileExistsError if it exists; with `replacing_tag`,
    replace it instead, but only while its entity tag is still that (else FileExistsError)."""
    fs, path, _ = _open(location)
    builder = fs.createFile(path).overwrite(replacing_tag is not None)
    builder = builder.opt(_IF_TAG, replacing_tag) if replacing_tag else builder.opt(_IF_ABSENT, True)
    try:
        stream = builder.build()
        stream.write(bytearray(data))
        stream.close()  # an object store publishes (or refuses) the file here
    except Py4JJavaError as error:
        if _java_error(error) in _EXISTS:
            raise FileExistsError(location) from None
        raise


def remove(location: str, recursive: bool = False) -> None:
    """Delete the file (or, `recursive`, the folder and all below it); nothing if absent."""
    fs, path, _ = _open(location)
    fs.delete(path, recursive)
