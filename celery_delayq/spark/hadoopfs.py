"""Files on any Hadoop filesystem (``file://``, ``hdfs://``, ``s3a://``, a bare path on the
default one) through the Spark driver's JVM, for what Spark's readers and writers do not do:
looking before reading, and writing one text file."""

from __future__ import annotations

import os

_CHUNK = 1 << 20  # bytes per call into the JVM


def uri(path: str | os.PathLike) -> str:
    """``path`` as Hadoop takes it: a URI as given, a local path as text, no trailing slash."""
    return os.fspath(path).rstrip("/") or "/"


def _resolve(spark, path: str):
    """(Hadoop Path, its FileSystem) under the session's Hadoop configuration."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    return hadoop_path, hadoop_path.getFileSystem(conf)


def exists(spark, path: str) -> bool:
    hadoop_path, fs = _resolve(spark, path)
    return bool(fs.exists(hadoop_path))


def data_suffixes(spark, root: str, suffixes: tuple[str, ...]) -> set[str]:
    """Which of ``suffixes`` the data files under ``root`` (at any depth) end with. Names
    starting with ``_`` or ``.`` are passed over, as Spark's readers pass over them."""
    hadoop_path, fs = _resolve(spark, root)
    top = fs.makeQualified(hadoop_path).toUri().getPath().rstrip("/")
    files = fs.listFiles(hadoop_path, True)
    found = set()
    while files.hasNext():
        path = files.next().getPath()
        below = path.toUri().getPath()[len(top):].split("/")
        suffix = next((s for s in suffixes if path.getName().endswith(s)), None)
        if suffix and not any(part[:1] in ("_", ".") for part in below):
            found.add(suffix)
    return found


def write_text(spark, path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, replacing it; parent folders are created."""
    hadoop_path, fs = _resolve(spark, path)
    data = text.encode("utf-8")
    stream = fs.create(hadoop_path, True)
    try:
        for start in range(0, len(data), _CHUNK):
            stream.write(bytearray(data[start:start + _CHUNK]))
    finally:
        stream.close()
