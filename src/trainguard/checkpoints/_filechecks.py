"""Integrity checks for single weight files, without torch: torch.save archives, legacy
torch/plain pickles and safetensors.

Each check raises :class:`CheckFailed` with a reason, or returns notes (things worth
saying that do not make the file invalid). They are used for single ``*.pt`` files
and for the weight files inside Hugging Face, ``step_<n>`` and ``iter_<n>`` directories.

- torch.save (zip, the default since torch 1.6): quick mode checks that the zip
  end-of-central-directory exists (a truncated file loses it), that every member's
  local header is where the central directory says and its data ends before the
  central directory, and that a ``data.pkl`` member exists. Full mode also reads
  every member and checks its CRC-32 (``ZipFile.testzip``).
- Legacy torch.save (``_use_new_zipfile_serialization=False``): five pickles
  (magic, protocol, system info, data, storage keys) followed by every storage as
  an 8-byte element count and the raw elements. The pickles are walked with an
  inert unpickler and the storage section must end exactly at the end of the file.
- Any other pickle: the opcode stream must end with STOP exactly at the end of file.
- Every pickle (a plain one, a zip's ``data.pkl``, a legacy file's streams) must also
  pass the inert unpickler's bounds (:mod:`._pickle_bounds`): a stream that would
  make a load allocate, nest or hash past its budget (a 9-byte memo bomb) is
  invalid, so that it is never chosen for a restore.
- safetensors: 8-byte header length, a JSON header, and tensor data whose extents
  cover the rest of the file exactly.
"""

from __future__ import annotations

import json
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from trainguard.checkpoints._fs import (
    CheckFailed,
    VerifyMode,
    describe_os_error,
    file_size,
    open_regular,
)
from trainguard.checkpoints._pickle_bounds import (
    Budget,
    PickleMalformed,
    PickleRefused,
    scan_stream,
)
from trainguard.checkpoints._safe_pickle import StubUnpickler, stub_name

# Pickles up to this size are scanned against the bounds (data.pkl holds structure
# only; larger ones are not read by trainguard at all, see _contents.MAX_PICKLE_BYTES).
MAX_SCANNED_PICKLE = 64 << 20
# Text arguments (GLOBAL names, INT/LONG digits) longer than this are not in real pickles.
_MAX_LINE = 1 << 20

_ZIP_LOCAL_MAGIC = b"PK\x03\x04"
_LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C

# Bytes per element of torch's typed storages (legacy format counts elements).
_STORAGE_ELEMENT_SIZE = {
    "DoubleStorage": 8,
    "FloatStorage": 4,
    "HalfStorage": 2,
    "BFloat16Storage": 2,
    "LongStorage": 8,
    "IntStorage": 4,
    "ShortStorage": 2,
    "CharStorage": 1,
    "ByteStorage": 1,
    "BoolStorage": 1,
    "ComplexFloatStorage": 8,
    "ComplexDoubleStorage": 16,
    "QInt8Storage": 1,
    "QUInt8Storage": 1,
    "QInt32Storage": 4,
    "QUInt4x2Storage": 1,
    "QUInt2x4Storage": 1,
    "UntypedStorage": 1,
}

_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def _open(path: Path, label: str) -> BinaryIO:
    return open_regular(path, label)


def check_torch_file(path: Path, label: str, verify: VerifyMode) -> list[str]:
    """Check a file written by ``torch.save`` (zip or legacy) or plain ``pickle``."""
    size = file_size(path, label)
    if size == 0:
        raise CheckFailed(f"file {label}: empty (0 bytes)")
    with _open(path, label) as fh:
        try:
            head = fh.read(4)
        except OSError as exc:
            raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
    if head == _ZIP_LOCAL_MAGIC:
        return _check_zip(path, label, size, verify)
    if head[:1] == b"\x80":  # pickle protocol >= 2 starts with PROTO
        return _check_pickle(path, label, size)
    raise CheckFailed(f"file {label}: neither a torch.save zip archive nor a pickle")


def _check_zip(path: Path, label: str, size: int, verify: VerifyMode) -> list[str]:
    with open_regular(path, label) as raw:
        return _check_zip_file(raw, path, label, size, verify)


def _check_zip_file(
    raw: BinaryIO, path: Path, label: str, size: int, verify: VerifyMode
) -> list[str]:
    try:
        zf = zipfile.ZipFile(raw)
    except zipfile.BadZipFile as exc:
        raise CheckFailed(f"file {label}: truncated zip archive ({exc})") from exc
    except OSError as exc:
        raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
    with zf:
        infos = zf.infolist()
        if not any(i.filename.endswith("data.pkl") for i in infos):
            raise CheckFailed(f"file {label}: zip archive without data.pkl: not a torch.save file")
        # ZipFile records where the central directory begins; members must end before it.
        start_dir = int(getattr(zf, "start_dir", size))
        if start_dir > size:
            raise CheckFailed(f"file {label}: truncated zip archive")
        try:
            with open_regular(path, label) as fh:
                for info in infos:
                    fh.seek(info.header_offset)
                    local = fh.read(30)
                    if len(local) < 30 or local[:4] != _ZIP_LOCAL_MAGIC:
                        raise CheckFailed(
                            f"file {label}: zip member {info.filename}: local header missing "
                            "(truncated or corrupt archive)"
                        )
                    name_len, extra_len = struct.unpack("<HH", local[26:30])
                    end = info.header_offset + 30 + name_len + extra_len + info.compress_size
                    if end > start_dir:
                        raise CheckFailed(
                            f"file {label}: zip member {info.filename} overruns the archive "
                            "(truncated or corrupt archive)"
                        )
        except OSError as exc:
            raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
        _check_data_pkl(zf, label)
        if verify == "quick":
            return []
        notes: list[str] = []
        # torch can be told not to compute CRC-32 (a zero CRC); such members are
        # only size-checked, and we say so.
        no_crc = [i for i in infos if i.CRC == 0 and i.file_size > 0]
        for info in infos:
            if info in no_crc:
                continue
            try:
                with zf.open(info) as member:
                    while member.read(8 << 20):
                        pass
            except zipfile.BadZipFile as exc:
                if "CRC" in str(exc):
                    reason = f"zip member {info.filename}: CRC mismatch (contents damaged)"
                else:
                    reason = f"zip member {info.filename}: corrupt ({exc})"
                raise CheckFailed(f"file {label}: {reason}") from exc
            except (OSError, EOFError) as exc:
                why = describe_os_error(exc) if isinstance(exc, OSError) else "truncated"
                raise CheckFailed(f"file {label}: zip member {info.filename}: {why}") from exc
        if no_crc:
            notes.append(f"{label}: {len(no_crc)} zip member(s) without CRC-32 not content-checked")
        return notes


class _Clamped:
    """A file as ``pickletools.genops`` reads it, where no read asks for more than the
    file holds: a length prefix of 2**62 is a short read (an error), not a 2**62-byte
    buffer (MemoryError)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        here = fh.tell()
        self._end = fh.seek(0, 2)
        fh.seek(here)

    def tell(self) -> int:
        return self._fh.tell()

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._end - self._fh.tell())
        return self._fh.read(left if n < 0 else min(n, left))

    def readline(self) -> bytes:
        return self._fh.readline(_MAX_LINE)


def scan_refusal(data: bytes) -> str | None:
    """Why loading the pickle ``data`` would fail, as a verdict's reason, or None."""
    try:
        scan_stream(data, Budget.for_stream(len(data)))
    except PickleRefused as exc:
        return f"hostile pickle, {exc}"
    except PickleMalformed as exc:
        return f"corrupt pickle ({exc})"
    return None


def _check_data_pkl(zf: zipfile.ZipFile, label: str) -> None:
    """The archive's ``data.pkl`` (the shallowest one, as torch.load reads it) within bounds."""
    pkls = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
    info = min(pkls, key=lambda i: i.filename.count("/"))
    if info.file_size > MAX_SCANNED_PICKLE:
        return
    try:
        with zf.open(info) as member:
            data = member.read(MAX_SCANNED_PICKLE + 1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return  # damage is the CRC check's to report, in full mode
    refusal = scan_refusal(data)
    if refusal is not None:
        raise CheckFailed(f"file {label}: {info.filename}: {refusal}")


def _walk_pickle(fh: BinaryIO, label: str) -> list[tuple[str, Any]]:
    """Parse (never execute) the pickle at the current position; returns its opcodes.

    Leaves ``fh`` just after the STOP opcode. Arguments are kept only for the
    first few opcodes, enough to recognise torch's magic number.
    """
    ops: list[tuple[str, Any]] = []
    try:
        clamped: Any = _Clamped(fh)  # genops only calls read, readline and tell
        for op, arg, _pos in pickletools.genops(clamped):
            if len(ops) < 4:
                ops.append((op.name, arg))
    except (ValueError, EOFError, pickle.UnpicklingError, struct.error, IndexError) as exc:
        raise CheckFailed(f"file {label}: truncated or corrupt pickle ({exc})") from exc
    return ops


def _load_range(fh: BinaryIO, start: int, end: int, *, persistent: bool) -> tuple[Any, list[Any]]:
    fh.seek(start)
    unpickler = StubUnpickler(fh.read(end - start), stub_all=True, allow_persistent=persistent)
    return unpickler.load(), unpickler.persistent_ids


def _check_pickle(path: Path, label: str, size: int) -> list[str]:
    with _open(path, label) as fh:
        try:
            ops = _walk_pickle(fh, label)
            pos = fh.tell()
            is_legacy_torch = any(
                name.startswith("LONG") and arg == _LEGACY_TORCH_MAGIC for name, arg in ops
            )
            if not is_legacy_torch:
                if pos != size:
                    raise CheckFailed(
                        f"file {label}: {size - pos} unexpected bytes after the pickle"
                    )
                if size <= MAX_SCANNED_PICKLE:
                    fh.seek(0)
                    refusal = scan_refusal(fh.read(size))
                    if refusal is not None:
                        raise CheckFailed(f"file {label}: {refusal}")
                return []
            return _check_legacy_torch(fh, label, size)
        except OSError as exc:
            raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc


def _check_legacy_torch(fh: BinaryIO, label: str, size: int) -> list[str]:
    _walk_pickle(fh, label)  # protocol version
    _walk_pickle(fh, label)  # system info
    data_start = fh.tell()
    _walk_pickle(fh, label)  # the saved object; storages are persistent ids
    keys_start = fh.tell()
    _walk_pickle(fh, label)  # the storage keys, in the order their data follows
    pos = fh.tell()
    try:
        _obj, pids = _load_range(fh, data_start, keys_start, persistent=True)
        keys, _ = _load_range(fh, keys_start, pos, persistent=False)
    except Exception as exc:  # a damaged stream may raise anything while loading
        if str(exc).startswith("refused"):
            raise CheckFailed(f"file {label}: hostile pickle, {exc}") from exc
        raise CheckFailed(f"file {label}: corrupt pickle ({type(exc).__name__})") from exc
    elem_size: dict[str, int] = {}
    for pid in pids:
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            name = (stub_name(pid[1]) or "").rsplit(".", 1)[-1]
            if name not in _STORAGE_ELEMENT_SIZE:
                return [f"{label}: legacy storage type {name or '?'} unknown; data not checked"]
            elem_size[str(pid[2])] = _STORAGE_ELEMENT_SIZE[name]
    if not isinstance(keys, list):
        raise CheckFailed(f"file {label}: corrupt legacy torch file (storage key list)")
    for key in keys:
        fh.seek(pos)
        raw = fh.read(8)
        if len(raw) < 8:
            raise CheckFailed(f"file {label}: truncated (storage {key} missing)")
        (count,) = struct.unpack("<q", raw)
        pos += 8 + count * elem_size.get(str(key), 1)
        if count < 0 or pos > size:
            raise CheckFailed(f"file {label}: truncated (storage {key} incomplete)")
    if pos != size:
        raise CheckFailed(f"file {label}: {size - pos} unexpected bytes after the storages")
    return []


def check_safetensors(path: Path, label: str) -> list[str]:
    """The header parses and the tensors' extents cover the data section exactly."""
    size = file_size(path, label)
    if size < 8:
        raise CheckFailed(f"file {label}: truncated safetensors file ({size} bytes)")
    with _open(path, label) as fh:
        try:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > min(size - 8, 100 << 20):
                raise CheckFailed(f"file {label}: truncated or corrupt safetensors header")
            header_bytes = fh.read(hlen)
        except OSError as exc:
            raise CheckFailed(f"file {label}: {describe_os_error(exc)}") from exc
    try:
        header: Any = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckFailed(f"file {label}: corrupt safetensors header (not JSON)") from exc
    if not isinstance(header, dict):
        raise CheckFailed(f"file {label}: corrupt safetensors header")
    data_len = size - 8 - hlen
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in entry["data_offsets"])
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            width = _SAFETENSORS_DTYPE_BYTES.get(str(entry["dtype"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckFailed(f"file {label}: corrupt safetensors entry {name}") from exc
        if width is not None and stop - begin != count * width:
            raise CheckFailed(f"file {label}: tensor {name} size does not match its shape")
        end = max(end, stop)
    if end > data_len:
        raise CheckFailed(
            f"file {label}: truncated safetensors file (data needs {end} bytes, has {data_len})"
        )
    if end < data_len:
        raise CheckFailed(f"file {label}: {data_len - end} unexpected bytes after tensor data")
    return []


def check_weight_file(path: Path, label: str, verify: VerifyMode) -> list[str]:
    """Dispatch on the file name: safetensors or torch/pickle."""
    if path.name.endswith(".safetensors"):
        return check_safetensors(path, label)
    return check_torch_file(path, label, verify)
