"""Triton's system shared memory extension for `kiln serve`: a client on the same machine
registers a POSIX shared-memory object once (name -> key, offset, byte size) and each inference
request then names the region, offset and size of its inputs, and where its outputs go, instead
of carrying their bytes. A ResNet-50 input is 602 KB that gRPC or HTTP would otherwise receive,
copy and parse on the front end's event loop; from a region it is an np.frombuffer over the
mapping (the batcher copies it into the batch, as it copies every request's input).

Clients are Triton's own (tritonclient.utils.shared_memory with the gRPC or HTTP client's
register_system_shared_memory, InferInput.set_shared_memory,
InferRequestedOutput.set_shared_memory): the endpoints and parameters are Triton's
(docs/protocol/extension_shared_memory.md of triton-inference-server/server).

Registrations with `kiln serve --workers N`: each worker is a process of its own and the kernel
hands each connection to any of them, so a region registered through one worker must be usable
through every other. The supervisor makes a folder (KILN_SERVE_SHM_DIR) and the workers keep one
record file per region there (its name percent-encoded; JSON name, key, offset, byte_size):
- register writes the record to a temporary file and os.link()s it to its name: the link is
  atomic and fails when the name exists, so two workers registering one name at once give one
  success and one 'already registered', and a record is never seen half written;
- unregister unlinks records; a request that names a region stats its record (one stat on
  tmpfs, about a microsecond) and compares the record's identity (inode, ctime) with the one
  its cached mapping came from, so a region unregistered, or unregistered and registered again
  with another key, through another worker is never used stale; mappings whose records are gone
  are also dropped by sweep(), which the server runs every SWEEP_S seconds, so an unregistered
  object's memory is not kept mapped by a worker that no request reaches;
- a request racing an unregister of its own region gets either the old region or 'unknown
  region', as it would against one process.
One process (no --workers) keeps its registrations in memory only, with no stat per request.

Limits (as Triton's): the server maps whatever /dev/shm object a client names and can read and
write it, so the extension is for clients on the server's machine that the server's user
trusts; a client that truncates an object while it is registered can make the server fault
(SIGBUS) reading it. Regions are system memory only: CUDA shared memory is refused.
"""
from __future__ import annotations

import functools
import json
import mmap
import os
import re
import stat
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from kiln.batching import RequestError

SHM_ROOT = "/dev/shm"
REGISTRY_ENV = "KILN_SERVE_SHM_DIR"  # the workers' shared folder of records (serve_workers)
SWEEP_S = 2.0                        # how often a worker drops mappings unregistered elsewhere
REGION, SIZE, OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"
CUDA_UNSUPPORTED = "kiln serve supports system shared memory, not CUDA shared memory"
_MAX_NAME = 200  # a record's file name is the region's name percent-encoded (NAME_MAX 255)


class RegionError(RequestError):
    """A shared-memory request kiln cannot honour: the HTTP status and the gRPC status code's
    name to answer it with (400 / INVALID_ARGUMENT unless said otherwise)."""

    def __init__(self, message: str, status: int = 400, grpc_code: str = "INVALID_ARGUMENT"):
        super().__init__(message)
        self.status, self.grpc_code = status, grpc_code


@dataclass
class Region:
    """A registered region and, once this process has used it, its object's mapping."""
    name: str
    key: str
    offset: int
    byte_size: int
    mm: Optional[mmap.mmap] = None
    ident: tuple = ()  # its record's (inode, ctime) in the workers' folder
    writable: bool = True
    fd: int = -1  # the object, kept open to see its size at each use (span); -1: none

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def release(self) -> None:
        """Unmaps the object, unless arrays still view it (a request in flight): then the
        mapping goes with the last of them."""
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def object_path(key: str) -> str:
    """/dev/shm/KEY for a shm_open key ('/name' or 'name', as tritonclient passes it to
    Python's SharedMemory); RegionError for a key that is not one object's name there."""
    if not isinstance(key, str):
        raise RegionError(f"shared memory key {key!r} is not a string")
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise RegionError(f"shared memory key '{key}' is not the name of a POSIX shared "
                          "memory object ('/name' or 'name')")
    return os.path.join(SHM_ROOT, name)


def map_object(key: str) -> tuple:
    """(mapping of the whole object `key`, whether it is writable, its open descriptor: the
    caller's to close); RegionError when it does not exist or cannot be mapped. Read-write where
    the object allows it (outputs are written into it), else read-only."""
    path = object_path(key)
    writable = True
    # As shm_open(3) opens it: never through a symbolic link (one in /dev/shm could otherwise
    # aim the server's writes at any file its user may write).
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDWR | flags)
    except PermissionError:
        writable = False
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except OSError as e:
            raise RegionError(f"cannot open shared memory object '{key}' ({path}): "
                              f"{e.strerror}") from None
    except FileNotFoundError:
        raise RegionError(f"shared memory key '{key}': no such object ({path})") from None
    except OSError as e:
        raise RegionError(f"cannot open shared memory object '{key}' ({path}): "
                          f"{e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RegionError(f"shared memory key '{key}' ({path}) is not a shared memory object")
        size = st.st_size
        if size == 0:
            raise RegionError(f"shared memory object '{key}' ({path}) is empty")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    except OSError as e:
        os.close(fd)
        raise RegionError(f"cannot map shared memory object '{key}' ({path}): "
                          f"{e.strerror or e}") from None
    except BaseException:
        os.close(fd)
        raise
    return mm, writable, fd


def _whole(value, what: str) -> int:
    """A size or offset from a request: an int >= 0 (JSON's true is not one)."""
    if type(value) is not int or value < 0:
        raise RegionError(f"{what} {value!r} is not a whole number of bytes")
    return value


class Registry:
    """This process's registered regions. `records`: the folder shared by the workers of one
    server (see the module's docstring), or None for a server of one process."""

    def __init__(self, records: Optional[str] = None):
        self.records = records
        self.regions: dict[str, Region] = {}

    # ---- the extension's endpoints
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not isinstance(name, str) or not name or "\0" in name:
            raise RegionError(f"shared memory region name {name!r} is not a non-empty string "
                              "(without NUL)")
        if len(name) > _MAX_NAME:
            raise RegionError(f"shared memory region name '{name[:40]}...' is over "
                              f"{_MAX_NAME} characters")
        offset = _whole(offset, "offset")
        byte_size = _whole(byte_size, "byte_size")
        if self._exists(name):
            raise self._taken(name)
        mm, writable, fd = map_object(key)
        region = Region(name, key, offset, byte_size, mm, writable=writable, fd=fd)
        if offset + byte_size > len(mm):
            size = len(mm)
            region.release()
            raise RegionError(f"shared memory region '{name}': offset {offset} + byte_size "
                              f"{byte_size} is beyond object '{key}' of {size} bytes")
        if self.records is not None:
            try:
                region.ident = self._write_record(region)
            except BaseException:
                region.release()
                raise
        self.regions[name] = region

    def unregister(self, name: str = "") -> None:
        """Drops region `name`, or every region when name is ''; a name not registered is not
        an error (as Triton's)."""
        if self.records is not None:
            names = [name] if name else self._record_names()
            for n in names:
                try:
                    os.unlink(self._record(n))
                except FileNotFoundError:
                    pass
        for n in ([name] if name else list(self.regions)):
            region = self.regions.pop(n, None)
            if region is not None:
                region.release()

    def status(self, name: str = "") -> list:
        """Region statuses ({name, key, offset, byte_size}), of `name` or of every region;
        RegionError (404) for a name not registered."""
        if name:
            return [self.get(name, status=True).status()]
        if self.records is None:
            return [r.status() for r in self.regions.values()]
        out = []
        for n in self._record_names():
            record = self._read_record(n)
            if record is not None:
                out.append(record.status())
        return out

    # ---- requests
    def get(self, name: str, status: bool = False) -> Region:
        """Region `name`, mapped in this process; RegionError when it is not registered."""
        if self.records is None:
            region = self.regions.get(name)
        else:
            region = self._current(name)
        if region is None:
            if status:
                raise RegionError(f"no shared memory region '{name}' is registered", 404,
                                  "NOT_FOUND")
            raise RegionError(f"unknown shared memory region '{name}' (register it first: "
                              "register_system_shared_memory)")
        return region

    def span(self, what: str, name, byte_size, offset) -> tuple:
        """(region, offset of the tensor's first byte in its mapping) for `byte_size` bytes at
        `offset` in region `name`, checked to lie within the region; `what` names the tensor
        in the errors ("input 'x'")."""
        if not isinstance(name, str):
            raise RegionError(f"{what}: {REGION} {name!r} is not a string")
        byte_size = _whole(byte_size, f"{what}: {SIZE}")
        offset = _whole(offset, f"{what}: {OFFSET}")
        region = self.get(name)
        # A client that shrinks its object after registering it would make the mapping's pages
        # past the new end fault (SIGBUS, the whole server): its size is checked at each use.
        fd = region.fd  # once: another thread's unregister may close it meanwhile
        if fd >= 0:
            try:
                size = os.fstat(fd).st_size
            except OSError:
                raise RegionError(f"{what}: shared memory region '{name}' was unregistered "
                                  "meanwhile") from None
            if size < region.offset + region.byte_size:
                raise RegionError(f"{what}: shared memory object '{region.key}' of region "
                                  f"'{name}' is now {size} bytes, under the "
                                  f"{region.offset + region.byte_size} it was registered with")
        if offset + byte_size > region.byte_size:
            raise RegionError(f"{what}: {OFFSET} {offset} + {SIZE} {byte_size} is beyond "
                              f"shared memory region '{name}' of {region.byte_size} bytes")
        return region, region.offset + offset

    def input_array(self, what: str, params: tuple, dtype: np.dtype, shape: list, count: int,
                    datatype: str) -> np.ndarray:
        """The input `params` ((region, byte_size, offset)) names, as an array over the
        mapping (no copy; copied only when the offset leaves it misaligned for its type)."""
        name, byte_size, offset = params
        region, start = self.span(what, name, byte_size, offset)
        need = count * dtype.itemsize
        if byte_size != need:
            raise RegionError(f"{what}: {SIZE} {byte_size}, shape {shape} of {datatype} "
                              f"takes {need}")
        a = np.frombuffer(region.mm, dtype, count, start).reshape(shape)
        return a if a.flags.aligned else a.copy()

    def check_output(self, what: str, params: tuple) -> None:
        """Before the inference: the output's region exists and is writable, and the span lies
        within it (the size it needs is known after)."""
        region, _ = self.span(what, *params)
        if not region.writable:
            raise RegionError(f"{what}: shared memory region '{params[0]}' is read-only to the "
                              "server")

    def write_output(self, what: str, params: tuple, arr: np.ndarray, datatype: str) -> None:
        """Copies output `arr` into the span `params` names; RegionError when it is too small."""
        region, start = self.span(what, *params)
        if arr.nbytes > params[1]:
            raise RegionError(f"{what}: {SIZE} {params[1]} of region '{params[0]}' is too "
                              f"small for shape {list(arr.shape)} of {datatype}, which takes "
                              f"{arr.nbytes} bytes")
        if not region.writable:
            raise RegionError(f"{what}: shared memory region '{params[0]}' is read-only to the "
                              "server")
        if arr.nbytes:
            np.copyto(np.ndarray(arr.shape, arr.dtype, buffer=region.mm, offset=start), arr)

    def sweep(self) -> None:
        """Unmaps the regions whose records other workers removed (or replaced)."""
        if self.records is None:
            return
        for name in list(self.regions):
            try:
                self._current(name)
            except RegionError:  # its object went away: dropped; the next request says so
                pass

    # ---- the workers' records
    def _record(self, name: str) -> str:
        return os.path.join(self.records, urllib.parse.quote(name, safe=""))

    def _record_names(self) -> list:
        try:
            files = os.listdir(self.records)
        except FileNotFoundError:
            return []
        return [urllib.parse.unquote(f) for f in sorted(files) if not f.startswith(".")]

    def _exists(self, name: str) -> bool:
        if self.records is None:
            return name in self.regions
        return os.path.exists(self._record(name))

    @staticmethod
    def _taken(name: str) -> RegionError:
        return RegionError(f"shared memory region '{name}' is already registered (unregister "
                           "it first)", 409, "ALREADY_EXISTS")

    def _write_record(self, region: Region) -> tuple:
        """Publishes `region`'s record (atomically; RegionError 409 when the name was taken in
        the meantime, by another worker); its identity."""
        fd, tmp = tempfile.mkstemp(prefix=".new-", dir=self.records)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(region.status(), f)
            try:
                os.link(tmp, self._record(region.name))
            except FileExistsError:
                raise self._taken(region.name) from None
        finally:
            os.unlink(tmp)
        st = os.stat(self._record(region.name))
        return (st.st_ino, st.st_ctime_ns)

    def _read_record(self, name: str) -> Optional[Region]:
        try:
            with open(self._record(name)) as f:
                st = os.fstat(f.fileno())
                d = json.load(f)
        except (OSError, ValueError):  # gone meanwhile (unregistered)
            return None
        return Region(d["name"], d["key"], d["offset"], d["byte_size"],
                      ident=(st.st_ino, st.st_ctime_ns))

    def _current(self, name: str) -> Optional[Region]:
        """Region `name` as the records say now, mapped (from the cache when its record has
        not changed), or None; a cached mapping whose record is gone or replaced is dropped."""
        cached = self.regions.get(name)
        try:
            st = os.stat(self._record(name))
        except (OSError, ValueError):  # not there; a name too long or with a NUL: never one
            st = None
        if cached is not None:
            if st is not None and cached.ident == (st.st_ino, st.st_ctime_ns):
                return cached
            del self.regions[name]
            cached.release()
        if st is None:
            return None
        region = self._read_record(name)
        if region is None:
            return None
        try:
            region.mm, region.writable, region.fd = map_object(region.key)
        except RegionError as e:  # its object went away after it was registered
            raise RegionError(f"shared memory region '{name}': {e}") from None
        if region.offset + region.byte_size > len(region.mm):
            size = len(region.mm)
            region.release()
            raise RegionError(f"shared memory region '{name}': object '{region.key}' is now "
                              f"{size} bytes, under offset {region.offset} + byte_size "
                              f"{region.byte_size}")
        self.regions[name] = region
        return region


@functools.lru_cache(maxsize=None)
def registry() -> Registry:
    """This process's registry: the workers' shared records where the supervisor made a folder
    for them (KILN_SERVE_SHM_DIR), else in memory."""
    return Registry(os.environ.get(REGISTRY_ENV) or None)


# ---- request parameters -------------------------------------------------------------------------
def grpc_params(params) -> Optional[tuple]:
    """(region, byte_size, offset) from a gRPC tensor's parameters map (InferParameter values),
    or None when it names no region; RegionError for a parameter of the wrong type."""
    if REGION not in params:
        return None
    values = []
    for key, kind, default in ((REGION, "string_param", None), (SIZE, "int64_param", None),
                               (OFFSET, "int64_param", 0)):
        if key not in params:
            if default is None:
                raise RegionError(f"{REGION} given without {SIZE}")
            values.append(default)
            continue
        p = params[key]
        if p.WhichOneof("parameter_choice") != kind:
            raise RegionError(f"parameter {key} must be a {kind}")
        values.append(getattr(p, kind))
    return tuple(values)


def rest_params(params) -> Optional[tuple]:
    """(region, byte_size, offset) from a REST tensor's parameters (a JSON object), or None
    when it names no region; the types are checked where they are used (Registry.span)."""
    if not isinstance(params, dict) or REGION not in params:
        return None
    if SIZE not in params:
        raise RegionError(f"{REGION} given without {SIZE}")
    return params[REGION], params[SIZE], params.get(OFFSET, 0)


# ---- the gRPC messages (Triton's grpc_service.proto; KServe's proto has none of them) -----------
@functools.lru_cache(maxsize=None)
def grpc_messages() -> dict:
    """Message classes of the system shared memory methods, in a descriptor pool of their own:
    KServe's and tritonclient's generated modules both define package 'inference' in the
    default pool, and cannot be imported into one process."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    f = descriptor_pb2.FileDescriptorProto(name="kiln_system_shared_memory.proto",
                                           package="inference", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    string, uint64, message = T.TYPE_STRING, T.TYPE_UINT64, T.TYPE_MESSAGE
    optional, repeated = T.LABEL_OPTIONAL, T.LABEL_REPEATED

    def add(msg, fields):
        for number, (fname, ftype, *rest) in enumerate(fields, 1):
            msg.field.add(name=fname, number=number, type=ftype,
                          label=rest[1] if len(rest) > 1 else optional,
                          type_name=rest[0] if rest else None)
        return msg

    region = [("name", string), ("key", string), ("offset", uint64), ("byte_size", uint64)]
    add(f.message_type.add(name="SystemSharedMemoryStatusRequest"), [("name", string)])
    status = f.message_type.add(name="SystemSharedMemoryStatusResponse")
    add(status.nested_type.add(name="RegionStatus"), region)
    entry = add(status.nested_type.add(name="RegionsEntry"), [
        ("key", string),
        ("value", message, ".inference.SystemSharedMemoryStatusResponse.RegionStatus")])
    entry.options.map_entry = True
    add(status, [("regions", message,
                  ".inference.SystemSharedMemoryStatusResponse.RegionsEntry", repeated)])
    add(f.message_type.add(name="SystemSharedMemoryRegisterRequest"), region)
    f.message_type.add(name="SystemSharedMemoryRegisterResponse")
    add(f.message_type.add(name="SystemSharedMemoryUnregisterRequest"), [("name", string)])
    f.message_type.add(name="SystemSharedMemoryUnregisterResponse")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.21
        from google.protobuf import message_factory

        factory = message_factory.MessageFactory(pool)

        def GetMessageClass(d):  # noqa: N802 - protobuf's name
            return factory.GetPrototype(d)
    return {m.name: GetMessageClass(pool.FindMessageTypeByName(f"inference.{m.name}"))
            for m in f.message_type}


# ---- the endpoints ------------------------------------------------------------------------------
GRPC_METHODS = ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
                "SystemSharedMemoryUnregister")
CUDA_GRPC_METHODS = ("CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
                     "CudaSharedMemoryUnregister")
REST_PREFIXES = ("/v2/systemsharedmemory", "/v2/cudasharedmemory")
_REST_PATH = re.compile(r"/v2/(systemsharedmemory|cudasharedmemory)(?:/region/([^/]+))?/"
                        r"(status|register|unregister)")


def grpc_call(method: str, body: bytes) -> bytes:
    """One of GRPC_METHODS on its serialized request: the serialized response; RegionError
    (with its gRPC status) for a request that cannot be honoured."""
    from google.protobuf.message import DecodeError

    msgs = grpc_messages()
    try:
        request = msgs[method + "Request"].FromString(body)
    except DecodeError as e:
        raise RegionError(f"malformed {method}Request: {e}") from None
    response = msgs[method + "Response"]()
    reg = registry()
    if method == "SystemSharedMemoryRegister":
        reg.register(request.name, request.key, request.offset, request.byte_size)
    elif method == "SystemSharedMemoryUnregister":
        reg.unregister(request.name)
    else:
        for st in reg.status(request.name):
            r = response.regions[st["name"]]
            r.name, r.key, r.offset, r.byte_size = (st["name"], st["key"], st["offset"],
                                                    st["byte_size"])
    return response.SerializeToString()


def rest_call(method: str, path: str, body: bytes) -> tuple:
    """A REST request to the extension's paths (REST_PREFIXES): (HTTP status, JSON body
    bytes). Triton's: GET .../status, POST .../region/NAME/register with {"key", "offset",
    "byte_size"}, POST .../unregister; every error is a status >= 400 with {"error": ...}."""
    try:
        return 200, _rest(method, path, body)
    except RegionError as e:
        return e.status, json.dumps({"error": str(e)}).encode()


def _rest(method: str, path: str, body: bytes) -> bytes:
    m = _REST_PATH.fullmatch(path)
    if m is None:
        raise RegionError(f"no such shared memory endpoint: {path[:200]}", 404, "NOT_FOUND")
    kind, name, action = m.group(1), m.group(2) or "", m.group(3)
    want = "GET" if action == "status" else "POST"
    if method != want:
        raise RegionError(f"{path} takes {want}, not {method}", 405, "UNIMPLEMENTED")
    if kind == "cudasharedmemory":
        raise RegionError(CUDA_UNSUPPORTED, 400, "UNIMPLEMENTED")
    reg = registry()
    if action == "status":
        return json.dumps(reg.status(name)).encode()
    if action == "unregister":
        reg.unregister(name)
        return b""
    if not name:
        raise RegionError("register takes a region name: "
                          "/v2/systemsharedmemory/region/NAME/register", 404, "NOT_FOUND")
    try:
        request = json.loads(body or b"null")
    except ValueError as e:
        raise RegionError(f"malformed register request: {e}") from None
    if not isinstance(request, dict) or "key" not in request or "byte_size" not in request:
        raise RegionError('malformed register request: the body must be a JSON object with '
                          '"key" and "byte_size" (and "offset")')
    reg.register(name, request["key"], request.get("offset", 0), request["byte_size"])
    return b""
