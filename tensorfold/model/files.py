"""Reading a checkpoint's files as untrusted input: regular files only, inside their own folder, up to a stated size.

A file may be a link, but only to a file in its own folder, or, when that folder is a hub snapshot
(`models--owner--name/snapshots/<revision>/`), to one in the repo's `blobs/` folder, where the hub keeps the real
files. The file type is checked with `stat` before the file is opened (without blocking) and again on the open
descriptor, so a FIFO or a device is refused without waiting for a writer or reading endless bytes.
"""
import json
import os
import stat

from tensorfold.errors import CheckpointError

MAX_JSON_BYTES = 64 << 20  # config.json, generation_config.json, tokenizer_config.json, the index, the template
MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json: a 250k vocabulary with its merges is about 20 MiB

NOT_REGULAR = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def allowed_folders(folder) -> list[str]:
    """Where the files of `folder` may really live: the folder itself, and for a hub snapshot its repo's blobs."""
    folder = os.path.realpath(folder)
    parent = os.path.dirname(folder)
    if os.path.basename(parent) == "snapshots":
        return [folder, os.path.join(os.path.dirname(parent), "blobs")]
    return [folder]


def open_checkpoint_file(path, error=CheckpointError):
    """`path` opened for binary reading, once it is known to be a regular file that stays inside its folder.

    Anything else raises `error` naming the file: a missing file, a link out of the folder, a FIFO, a device.
    """
    path = os.fspath(path)
    real = os.path.realpath(path)
    folders = allowed_folders(os.path.dirname(os.path.abspath(path)))
    if not any(os.path.commonpath([real, folder]) == folder for folder in folders):
        raise error(f"{path} links to {real}, outside the checkpoint folder {folders[0]}")
    try:
        before = os.stat(real)
        _check_regular(path, before.st_mode, error)
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror}") from None
    after = os.fstat(fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise error(f"{path} was replaced while it was being opened")
    return os.fdopen(fd, "rb")


def read_checkpoint_file(path, limit: int, error=CheckpointError, missing_ok: bool = False) -> bytes | None:
    """The bytes of a checkpoint file of at most `limit` bytes (None for a missing one if `missing_ok`)."""
    if missing_ok and not os.path.lexists(path):
        return None
    with open_checkpoint_file(path, error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{path} is {size} bytes, over the limit of {limit} bytes for this file")
        data = f.read(limit + 1)
    if len(data) > limit:  # the file grew after its size was read
        raise error(f"{path} is over the limit of {limit} bytes for this file")
    return data


def read_json_object(path, limit: int = MAX_JSON_BYTES, error=CheckpointError, missing_ok: bool = False) -> dict | None:
    """The JSON object in a checkpoint file (None for a missing one if `missing_ok`)."""
    data = read_checkpoint_file(path, limit, error, missing_ok)
    if data is None:
        return None
    value = parse_json(data, path, error)
    if not isinstance(value, dict):
        raise error(f"{path} must hold a JSON object, got a JSON {type(value).__name__}")
    return value


def parse_json(data: bytes, path, error=CheckpointError):
    """`data` (UTF-8 JSON) parsed; invalid or too deeply nested JSON raises `error` naming `path`."""
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:  # bad JSON, bad UTF-8, or an integer of more digits than Python converts
        raise error(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{path} is not valid JSON: it nests arrays or objects too deeply to parse") from None


def brief(value, limit: int = 80) -> str:
    """`value` as short one-line JSON for an error message: values from a hostile file may be huge or deep."""
    try:
        return one_line(json.dumps(value), limit)
    except RecursionError:
        return f"a deeply nested {type(value).__name__}"
    except ValueError:  # an integer of more digits than Python converts to text
        return "a value with an integer too long to print"


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line, cut to `limit` characters, for an error message."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _check_regular(path, mode: int, error) -> None:
    if not stat.S_ISREG(mode):
        kind = NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file")
        raise error(f"{path} is {kind}, not a regular file")
