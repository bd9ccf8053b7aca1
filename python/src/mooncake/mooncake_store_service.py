"""A standalone store process with a REST API, as the official
``python -m mooncake.mooncake_store_service`` (also the console script
``mc_store_rest_server``), over mooncake-go's ``mooncake.store``.

The process sets up one MooncakeDistributedStore (a client that contributes
global_segment_size bytes to the pool) from a JSON config file (--config),
else from the environment (MOONCAKE_CONFIG_PATH, or MOONCAKE_MASTER and the
other MOONCAKE_* variables), with -Dkey=value overrides; it retries the
setup for up to --max-wait-time seconds (the master may start after it),
then serves on 0.0.0.0:--port:

  PUT    /api/put            {"key": k, "value": text}   -> 200 {"status": "success"}
  GET    /api/get/{key}      -> 200 the bytes, 404 when absent
  GET    /api/exist/{key}    -> 200 {"exists": bool}
  DELETE /api/remove/{key}   -> 200 {"status": "success"}
  DELETE /api/remove_all     -> 200 {"status": "success removed N keys"}

The official admin calls (POST /api/reconfigure, /api/mount, /api/unmount,
/api/mount_shm, /api/unmount_shm, /api/unmount_local_disk) move segments
of a running client; mooncake-go's client mounts its segment once, at
setup, so they answer 501 with a JSON error that says so. Errors are JSON
{"error": ...} with the official status codes (400 for a bad request, 500
for a failed operation).

SIGINT and SIGTERM close the store and exit 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional
from urllib.parse import unquote

from mooncake.store import MooncakeDistributedStore
from mooncake_go import parse_size as _parse_size

log = logging.getLogger("mooncake.mooncake_store_service")

# The official defaults of the service's configuration.
DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1 << 30
MAX_BODY = 100 << 20  # the official service's request size limit

_ADMIN = ("reconfigure", "mount", "unmount", "mount_shm", "unmount_shm", "unmount_local_disk")


def _bool(v) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on")


@dataclass
class ServiceConfig:
    """The store client's configuration: the official config file's keys."""

    local_hostname: str
    metadata_server: str
    master_server_address: str
    global_segment_size: int = DEFAULT_GLOBAL_SEGMENT_SIZE
    local_buffer_size: int = DEFAULT_LOCAL_BUFFER_SIZE
    protocol: str = "tcp"
    device_name: str = ""
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self):
        self.global_segment_size = _parse_size(self.global_segment_size)
        self.local_buffer_size = _parse_size(self.local_buffer_size)
        self.protocol = str(self.protocol).strip().lower()
        self.enable_ssd_offload = _bool(self.enable_ssd_offload)
        self.enable_client_http_server = _bool(self.enable_client_http_server)
        self.client_http_port = int(self.client_http_port)
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"config field {name!r} must be a non-empty string, got {v!r}")
        if self.global_segment_size < 0 or self.local_buffer_size < 0:
            raise ValueError("global_segment_size and local_buffer_size must not be negative")

    @classmethod
    def from_dict(cls, d: Dict) -> "ServiceConfig":
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            if name not in d:
                raise ValueError(f"missing required config field: {name}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_file(cls, path: str, overrides: Optional[Dict] = None) -> "ServiceConfig":
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        d.update(overrides or {})
        return cls.from_dict(d)

    @classmethod
    def from_env(cls, overrides: Optional[Dict] = None) -> "ServiceConfig":
        """MOONCAKE_CONFIG_PATH's file, else the MOONCAKE_* variables (then
        MOONCAKE_MASTER is required), as the official service reads them."""
        path = os.environ.get("MOONCAKE_CONFIG_PATH")
        if path:
            return cls.from_file(path, overrides)
        if not os.environ.get("MOONCAKE_MASTER"):
            raise ValueError("neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set")
        e = os.environ.get
        d = {
            "local_hostname": e("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            "metadata_server": e("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            "master_server_address": e("MOONCAKE_MASTER"),
            "global_segment_size": e("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE),
            "local_buffer_size": e("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE),
            "protocol": e("MOONCAKE_PROTOCOL", "tcp"),
            "device_name": e("MOONCAKE_DEVICE", ""),
            "enable_ssd_offload": e("MOONCAKE_OFFLOAD_ENABLED", "false"),
            "ssd_offload_path": e("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            "tenant_id": e("MOONCAKE_TENANT_ID", "default"),
            "enable_client_http_server": e("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false"),
            "client_http_port": e("MOONCAKE_CLIENT_HTTP_PORT", "9300"),
        }
        d.update(overrides or {})
        return cls.from_dict(d)


class StoreService:
    """One store client and the REST server in front of it."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.store: Optional[MooncakeDistributedStore] = None
        self.httpd: Optional[ThreadingHTTPServer] = None

    def start_store(self, max_wait_time: float = 60, stop: Optional[threading.Event] = None) -> bool:
        """Sets the store up, retrying once a second for max_wait_time
        seconds (or until stop is set); True once it is up."""
        c = self.config
        deadline = time.monotonic() + max_wait_time
        attempt = 0
        while True:
            attempt += 1
            store = MooncakeDistributedStore()
            ret = store.setup(c.local_hostname, c.metadata_server, c.global_segment_size, c.local_buffer_size,
                              c.protocol, c.device_name, c.master_server_address,
                              enable_ssd_offload=c.enable_ssd_offload, ssd_offload_path=c.ssd_offload_path,
                              tenant_id=c.tenant_id, enable_client_http_server=c.enable_client_http_server,
                              client_http_port=c.client_http_port)
            if ret == 0:
                self.store = store
                log.info("store service started on %s (attempt %d)", c.local_hostname, attempt)
                return True
            left = deadline - time.monotonic()
            log.warning("store setup failed (attempt %d, code %d); %.1fs left", attempt, ret, max(left, 0))
            if left <= 0 or (stop is not None and stop.wait(min(1.0, left))):
                return False
            if stop is None:
                time.sleep(min(1.0, left))

    def serve(self, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
        """Starts the REST server in a thread and returns it (its
        server_address has the port, when port is 0)."""
        service = self

        class Handler(_Handler):
            svc = service

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name="mooncake-store-service", daemon=True).start()
        log.info("REST API started on port %d", self.httpd.server_address[1])
        return self.httpd

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        if self.store is not None:
            ret = self.store.close()
            self.store = None
            if ret != 0:
                log.warning("store close returned %s", ret)


class _Handler(BaseHTTPRequestHandler):
    svc: StoreService
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # through logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, code: int, body, content_type: str = "application/json") -> None:
        data = json.dumps(body).encode() if content_type == "application/json" else body
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, msg: str) -> None:
        self._send(code, {"error": msg})

    def _key(self, prefix: str) -> Optional[str]:
        path = self.path.split("?", 1)[0]
        if not path.startswith(prefix) or len(path) == len(prefix):
            return None
        return unquote(path[len(prefix):])

    def _body(self) -> Optional[bytes]:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self._error(413, f"request body of {n} bytes over the {MAX_BODY}-byte limit")
            return None
        return self.rfile.read(n)

    def _guard(self, fn) -> None:
        try:
            fn()
        except Exception as e:  # an error answer, never a dead connection
            log.error("%s %s: %s", self.command, self.path, e)
            self._error(500, str(e))

    def do_PUT(self):
        if self.path.split("?", 1)[0] != "/api/put":
            return self._error(404, f"no PUT {self.path}")
        self._guard(self._put)

    def _put(self):
        raw = self._body()
        if raw is None:
            return
        try:
            data = json.loads(raw or b"{}")
        except ValueError as e:
            return self._error(400, f"body is not JSON: {e}")
        key, value = data.get("key"), data.get("value")
        if not key or value is None:
            return self._error(400, "Missing key or value")
        if self.svc.store.put(key, str(value).encode()) != 0:
            return self._error(500, "PUT operation failed")
        self._send(200, {"status": "success"})

    def do_GET(self):
        key = self._key("/api/get/")
        if key is not None:
            return self._guard(lambda: self._get(key))
        key = self._key("/api/exist/")
        if key is not None:
            return self._guard(lambda: self._exist(key))
        self._error(404, f"no GET {self.path}")

    def _get(self, key: str):
        store = self.svc.store
        exists = store.is_exist(key)
        if exists == 0:
            return self._error(404, "Key not found")
        if exists < 0:
            return self._error(500, "Exist check failed")
        value = store.get(key)
        if value is None:
            return self._error(500, "GET operation failed")
        if value == b"" and store.is_exist(key) == 0:  # removed in between
            return self._error(404, "Key not found")
        self._send(200, bytes(value), "application/octet-stream")

    def _exist(self, key: str):
        exists = self.svc.store.is_exist(key)
        if exists < 0:
            return self._error(500, "Exist check failed")
        self._send(200, {"exists": exists > 0})

    def do_DELETE(self):
        path = self.path.split("?", 1)[0]
        if path == "/api/remove_all":
            return self._guard(self._remove_all)
        key = self._key("/api/remove/")
        if key is not None:
            return self._guard(lambda: self._remove(key))
        self._error(404, f"no DELETE {self.path}")

    def _remove(self, key: str):
        if self.svc.store.remove(key) != 0:
            return self._error(500, "Remove operation failed")
        self._send(200, {"status": "success"})

    def _remove_all(self):
        n = self.svc.store.remove_all()
        if n < 0:
            return self._error(500, "RemoveAll operation failed")
        self._send(200, {"status": f"success removed {n} keys"})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if path.startswith("/api/") and path[len("/api/"):] in _ADMIN:
            if self._body() is None:
                return
            return self._error(501, f"POST {path} is not supported by mooncake-go: its store client mounts "
                                    "its segment once, at setup; start another store service to add memory")
        self._error(404, f"no POST {self.path}")


def parse_arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Mooncake Store Service with REST API (mooncake-go)")
    p.add_argument("--config", type=str, help="Path to Mooncake config file", required=False)
    p.add_argument("-D", "--define", action="append", default=[],
                   help="Override configuration with key=value pairs (e.g., -Dlocal_hostname=example.com)")
    p.add_argument("--port", type=int, default=8080, help="HTTP API port (default: 8080; 0 picks one)")
    p.add_argument("--max-wait-time", type=float, default=60,
                   help="Maximum total wait time in seconds (default: 60)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    args = parse_arguments(argv)
    overrides = {}
    for item in args.define:
        if "=" not in item:
            log.warning("ignoring -D%s: want key=value", item)
            continue
        k, v = item.split("=", 1)
        overrides[k] = v
    config = ServiceConfig.from_file(args.config, overrides) if args.config else ServiceConfig.from_env(overrides)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.set())
    service = StoreService(config)
    try:
        if not service.start_store(args.max_wait_time, stop):
            if stop.is_set():
                return 0
            raise SystemExit("mooncake_store_service: the store did not start (see the log)")
        service.serve(args.port)
        log.info("Mooncake Store Service is running")
        stop.wait()
        log.info("shutting down")
        return 0
    finally:
        service.stop()


def sync_main() -> int:
    """Entry point of the mc_store_rest_server console script."""
    return main()


if __name__ == "__main__":
    raise SystemExit(main())
